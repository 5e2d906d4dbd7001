//! Job files (`docs/job-files.md`): the YAML a person writes, close to SkyPilot's task file, read
//! into the API's JobRequest (and, with a `service` section, a ServiceRequest) as JSON objects
//! that flags then go over. Every key is checked before anything is sent, and every fault names
//! its line and column.

use std::fmt;
use std::marker::PhantomData;

use serde::Deserialize;
use serde::de::value::{MapAccessDeserializer, SeqAccessDeserializer};
use serde::de::{self, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_json::{Map, Value, json};

/// What a job file asks for, as the API's fields.
#[derive(Debug, PartialEq)]
pub struct JobFile {
    /// The JobRequest's fields the file gives (none filled in by default).
    pub job: Map<String, Value>,
    /// The ServiceRequest's own fields (all but `replica`), when the file is read as a service.
    pub service: Option<Map<String, Value>>,
}

/// What the file is read for: a job refuses a service's keys and a service a gang's.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Purpose {
    Job,
    Service,
}

/// A fault in a job file: where (1-based) and what.
#[derive(Debug, PartialEq)]
pub struct FileError {
    pub line: usize,
    pub column: usize,
    pub message: String,
}

impl fmt::Display for FileError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}: {}", self.line, self.column, self.message)
    }
}

/// The job file's text as API requests.
pub fn parse(text: &str, purpose: Purpose) -> Result<JobFile, FileError> {
    let doc: Option<Doc> = serde_norway::from_str(text).map_err(|error| from_yaml(&error, text))?;
    let Some(doc) = doc else {
        return Err(at_start(
            "the job file is empty: give at least `run` or `resources`, `tier` and `max_price`",
        ));
    };
    doc.into_requests(text, purpose)
}

/// Whether a job file's text is the API's own JSON (an object) rather than YAML.
pub fn is_json(text: &str) -> bool {
    text.trim_start().starts_with('{')
}

fn at_start(message: &str) -> FileError {
    FileError {
        line: 1,
        column: 1,
        message: message.to_string(),
    }
}

/// A YAML parser's error, with SkyPilot's keys that Fallow spells otherwise named.
fn from_yaml(error: &serde_norway::Error, file: &str) -> FileError {
    let (mut line, mut column) = error.location().map_or((1, 1), |at| (at.line(), at.column()));
    let text = error.to_string();
    let text = match text.rfind(" at line ") {
        Some(end) if error.location().is_some() => text[..end].to_string(),
        _ => text,
    };
    let message = match text.split_once("unknown field `") {
        Some((before, rest)) => {
            let key = rest.split('`').next().unwrap_or_default();
            let section = before.trim_end_matches(": ").trim();
            let place = if section.is_empty() {
                "at the top level".to_string()
            } else {
                format!("in {section}")
            };
            match hint(key) {
                Some(hint) => format!("unknown key `{key}` {place}; {hint}"),
                None => {
                    let known = rest.split_once(", expected ").map_or("", |(_, known)| known);
                    let known = known.trim_start_matches("one of ");
                    format!("unknown key `{key}` {place}; the keys here are {known}")
                }
            }
        }
        None if text.contains("invalid type") && text.contains("expected struct Doc") => {
            (line, column) = (1, 1);
            "a job file is a mapping of keys (name, resources, run, …), not a list or a single value".to_string()
        }
        None if text.contains("duplicate field `") => {
            // Placed at the mapping that holds it: find the key's second time there.
            let key = text.split('`').nth(1).unwrap_or_default();
            let again = file
                .lines()
                .enumerate()
                .skip(line.saturating_sub(1))
                .filter(|(_, written)| {
                    let content = written.trim_start();
                    written.len() - content.len() == column - 1 && content.starts_with(&format!("{key}:"))
                })
                .nth(1);
            if let Some((index, _)) = again {
                line = index + 1;
            }
            text.replace("field", "key")
        }
        None => text,
    };
    FileError { line, column, message }
}

/// Fallow's form of keys other tools' task files have.
fn hint(key: &str) -> Option<&'static str> {
    Some(match key {
        "use_spot" | "spot_recovery" => "Fallow's form is `tier: bronze` (interruptible) at the top level",
        "job_recovery" => "Fallow restarts a gang itself: `gang: {max_restarts: N}`, with `checkpoint: {dir: …}`",
        "region" | "zone" | "cloud" | "infra" => "Fallow's form is `regions: [REGION, …]` in resources",
        "file_mounts" | "storage_mounts" => {
            "Fallow stages `datasets` (url, digest, size) in $FALLOW_DATASETS_DIR before the job starts"
        }
        "workdir" => "nothing is uploaded: put the code in the image, or fetch it in `setup`",
        "instance_type" => "give `accelerators`, `cpus` and `memory` in resources",
        "disk_size" | "disk_tier" => "a replica's disk is not sold on its own",
        "image" => "Fallow's form is `image_id` in resources",
        "env" | "secrets" => "Fallow's form is `envs`",
        "replicas" | "gpus" => "give `num_nodes` (replicas) and `accelerators: MODEL:COUNT` in resources",
        "max_price_per_gpu_hour" => "Fallow's form is `max_price`",
        "port" => "Fallow's form is `ports` in resources",
        "target_qps_per_replica" => {
            "Fallow scales on requests in flight: `target_in_flight` (and on latency: `target_p95_ms`)"
        }
        _ => return None,
    })
}

/// The line and column of a key, found by its path in the file's block mappings; the start of
/// the file when a key is written in flow style (`{…}`) and cannot be found so.
fn locate(text: &str, path: &[&str]) -> (usize, usize) {
    let mut found = (1, 1);
    // The indentation of the mapping searched (the top level's is 0) and where it starts.
    let mut level: Option<usize> = Some(0);
    let mut parent_indent: Option<usize> = None;
    let mut from = 0;
    'keys: for key in path {
        for (index, line) in text.lines().enumerate().skip(from) {
            let content = line.trim_start();
            if content.is_empty() || content.starts_with('#') {
                continue;
            }
            let written = content.strip_prefix("- ").unwrap_or(content);
            let indent = line.len() - written.len();
            if parent_indent.is_some_and(|parent| line.len() - content.len() <= parent) {
                break;
            }
            let wanted = *level.get_or_insert(indent);
            if indent != wanted {
                continue;
            }
            let named = [format!("{key}:"), format!("\"{key}\":"), format!("'{key}':")];
            if named.iter().any(|form| written.starts_with(form.as_str())) {
                found = (index + 1, indent + 1);
                parent_indent = Some(line.len() - content.len());
                level = None;
                from = index + 1;
                continue 'keys;
            }
        }
        break;
    }
    found
}

// ------------------------------------------------------------------------------------------------
// The file's form.

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Doc {
    name: Option<String>,
    resources: Option<Resources>,
    num_nodes: Option<Bounded<1, { api::REPLICAS_MAX as u64 }>>,
    tier: Option<Choice<Tiers>>,
    max_price: Option<Decimal<Price>>,
    preemptible: Option<bool>,
    class: Option<Choice<Classes>>,
    max_runtime: Option<Seconds>,
    envs: Option<Envs>,
    setup: Option<String>,
    run: Option<String>,
    command: Option<Vec<String>>,
    runtime: Option<Choice<Runtimes>>,
    datasets: Option<Vec<Dataset>>,
    checkpoint: Option<Checkpoint>,
    gang: Option<Gang>,
    network: Option<Choice<Networks>>,
    client_token: Option<String>,
    output_url: Option<OutputUrl>,
    reservation: Option<Bounded<1, { i64::MAX as u64 }>>,
    service: Option<Service>,
}

#[derive(Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct Resources {
    accelerators: Option<Accelerators>,
    compute_units: Option<Decimal<ComputeUnits>>,
    cpus: Option<Cpus>,
    memory: Option<SizeMib>,
    gpu_memory: Option<SizeMib>,
    image_id: Option<String>,
    ports: Option<Port>,
    regions: Option<Regions>,
    topology: Option<Choice<Topologies>>,
    min_reliability: Option<Fraction>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Checkpoint {
    dir: Option<String>,
    interval: Option<Seconds>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Gang {
    repair: Option<Choice<GangRepairs>>,
    max_restarts: Option<u32>,
    repair_billing: Option<Choice<RepairBillings>>,
}

#[derive(Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct Service {
    name: Option<String>,
    readiness_probe: Option<Probe>,
    replicas: Option<u32>,
    replica_policy: Option<ReplicaPolicy>,
    wake_timeout: Option<Seconds>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ReplicaPolicy {
    min_replicas: Option<u32>,
    max_replicas: Option<u32>,
    target_in_flight: Option<u32>,
    target_p95_ms: Option<u32>,
    burst_tier: Option<Choice<Tiers>>,
    upscale_delay_seconds: Option<u32>,
    downscale_delay_seconds: Option<u32>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ProbeForm {
    path: Option<String>,
    initial_delay_seconds: Option<u32>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct DatasetForm {
    url: String,
    digest: String,
    size: SizeBytes,
}

impl Doc {
    fn into_requests(self, text: &str, purpose: Purpose) -> Result<JobFile, FileError> {
        let fault = |path: &[&str], message: String| {
            let (line, column) = locate(text, path);
            FileError { line, column, message }
        };
        let mut job = Map::new();
        let mut set = |key: &str, value: Value| {
            job.insert(key.to_string(), value);
        };
        if let Some(name) = &self.name {
            set("name", json!(name));
        }
        let resources = self.resources.unwrap_or_default();
        if let Some(accelerators) = &resources.accelerators {
            if resources.compute_units.is_some() {
                return Err(fault(
                    &["resources", "compute_units"],
                    "give `accelerators` or `compute_units`, not both: compute units let the matcher choose the GPUs"
                        .to_string(),
                ));
            }
            if !accelerators.models.is_empty() {
                set("gpu_models", json!(accelerators.models));
            }
            match accelerators.count {
                Count::Whole(count) => set("gpus", json!(count)),
                Count::Share(milli) => set("gpu_share_milli", json!(milli)),
            }
        }
        if let Some(units) = &resources.compute_units {
            set("compute_units", json!(units.text));
        }
        if let Some(cpus) = &resources.cpus {
            set("cpu_milli", json!(cpus.0));
        }
        if let Some(memory) = &resources.memory {
            set("memory_mib", json!(memory.0));
        }
        if let Some(memory) = &resources.gpu_memory {
            let mib = u32::try_from(memory.0).map_err(|_| {
                fault(
                    &["resources", "gpu_memory"],
                    "is more GPU memory than any GPU has".to_string(),
                )
            })?;
            set("gpu_memory_mib_min", json!(mib));
        }
        if let Some(regions) = &resources.regions {
            set("regions", json!(regions.0));
        }
        if let Some(topology) = &resources.topology {
            set("topology", json!(topology.text));
        }
        if let Some(fraction) = &resources.min_reliability {
            set("min_reliability", json!(fraction.0));
        }
        if let Some(count) = &self.num_nodes {
            if purpose == Purpose::Service {
                return Err(fault(
                    &["num_nodes"],
                    "a service's replicas are counted by `service.replicas` or `service.replica_policy`, not `num_nodes`"
                        .to_string(),
                ));
            }
            set("replicas", json!(count.0));
        }
        if let Some(tier) = &self.tier {
            set("tier", json!(tier.text));
        }
        if let Some(price) = &self.max_price {
            set("max_price_per_gpu_hour", json!(price.text));
        }
        if let Some(preemptible) = self.preemptible {
            set("preemptible", json!(preemptible));
        }
        if let Some(class) = &self.class {
            set("class", json!(class.text));
        }
        if let Some(seconds) = &self.max_runtime {
            set("max_runtime_s", json!(seconds.0));
        }
        if let Some(envs) = &self.envs {
            let mut env = Map::new();
            for (key, value) in &envs.0 {
                let Some(value) = value else {
                    return Err(fault(
                        &["envs", key],
                        format!("`{key}` has no value: give one here, or pass it with --env {key}=VALUE"),
                    ));
                };
                env.insert(key.clone(), json!(value));
            }
            set("env", Value::Object(env));
        }
        if let Some(datasets) = &self.datasets {
            let datasets: Vec<Value> = datasets
                .iter()
                .map(|dataset| json!({"url": dataset.url, "digest": dataset.digest, "size_bytes": dataset.size_bytes}))
                .collect();
            set("datasets", json!(datasets));
        }
        if let Some(checkpoint) = &self.checkpoint {
            if let Some(dir) = &checkpoint.dir {
                set("checkpoint_dir", json!(dir));
            }
            if let Some(seconds) = &checkpoint.interval {
                set("checkpoint_interval_s", json!(seconds.0));
            }
        }
        if let Some(gang) = &self.gang {
            if let Some(repair) = &gang.repair {
                set("gang_repair", json!(repair.text));
            }
            if let Some(restarts) = gang.max_restarts {
                set("max_restarts", json!(restarts));
            }
            if let Some(billing) = &gang.repair_billing {
                set("repair_billing", json!(billing.text));
            }
        }
        if let Some(network) = &self.network {
            set("network", json!(network.text));
        }
        if let Some(token) = &self.client_token {
            set("client_token", json!(token));
        }
        if let Some(url) = &self.output_url {
            set("output_url", json!(url.0));
        }
        if let Some(id) = &self.reservation {
            if purpose == Purpose::Service {
                return Err(fault(
                    &["reservation"],
                    "a service's replicas run on the market, not inside a booking: `reservation` is for jobs"
                        .to_string(),
                ));
            }
            set("reservation", json!(id.0));
        }
        // What runs: the image and its command, or the program.
        let script = match (&self.setup, &self.run, &self.command) {
            (_, _, Some(_)) if self.setup.is_some() || self.run.is_some() => {
                return Err(fault(
                    &["command"],
                    "give `command` (words run as they are) or `setup` and `run` (shell scripts), not both".to_string(),
                ));
            }
            (Some(_), None, _) => {
                return Err(fault(
                    &["setup"],
                    "`setup` needs `run` after it: the job's exit status is the run's".to_string(),
                ));
            }
            (Some(setup), Some(run), _) => Some(format!("set -e\n{}\nset +e\n{run}", setup.trim_end())),
            (None, Some(run), _) => Some(run.clone()),
            (None, None, _) => None,
        };
        let process = self.runtime.as_ref().is_some_and(|runtime| runtime.text == "process");
        if let Some(runtime) = &self.runtime {
            set("runtime", json!(runtime.text));
        }
        if process {
            if resources.image_id.is_some() {
                return Err(fault(
                    &["resources", "image_id"],
                    "a process job runs a program on the host, not an image: drop `image_id` or `runtime: process`"
                        .to_string(),
                ));
            }
            let (program, arguments) = match (&script, &self.command) {
                (Some(script), _) => ("sh".to_string(), vec!["-c".to_string(), script.clone()]),
                (None, Some(command)) if !command.is_empty() => (command[0].clone(), command[1..].to_vec()),
                _ => {
                    return Err(fault(
                        &["runtime"],
                        "a process job needs `run` (a shell script) or `command` (the program and its arguments)"
                            .to_string(),
                    ));
                }
            };
            set("image", json!(program));
            set("command", json!(arguments));
        } else {
            if let Some(image) = &resources.image_id {
                set("image", json!(image.strip_prefix("docker:").unwrap_or(image)));
            }
            match (&script, &self.command) {
                (Some(script), _) => set("command", json!(["sh", "-c", script])),
                (None, Some(command)) => set("command", json!(command)),
                (None, None) => {}
            }
        }
        let service = match (purpose, self.service) {
            (Purpose::Job, Some(_)) => {
                return Err(fault(
                    &["service"],
                    "this file describes a service: deploy it with `fallow service deploy FILE`".to_string(),
                ));
            }
            (Purpose::Job, None) => {
                if resources.ports.is_some() {
                    return Err(fault(
                        &["resources", "ports"],
                        "`ports` are a service's: deploy it with `fallow service deploy FILE`".to_string(),
                    ));
                }
                None
            }
            (Purpose::Service, service) => Some(service_fields(service, &resources, self.name.as_deref(), &fault)?),
        };
        Ok(JobFile { job, service })
    }
}

/// A ServiceRequest's own fields from the `service` section and `resources.ports`.
fn service_fields(
    service: Option<Service>,
    resources: &Resources,
    file_name: Option<&str>,
    fault: &dyn Fn(&[&str], String) -> FileError,
) -> Result<Map<String, Value>, FileError> {
    let service = service.unwrap_or_default();
    let mut fields = Map::new();
    let mut set = |key: &str, value: Value| {
        fields.insert(key.to_string(), value);
    };
    if let Some(name) = service.name.as_deref().or(file_name) {
        set("name", json!(name));
    }
    if let Some(port) = &resources.ports {
        set("port", json!(port.0));
    }
    match service.readiness_probe {
        Some(Probe::Path(path)) => set("health_path", json!(path)),
        Some(Probe::Form(form)) => {
            if let Some(path) = form.path {
                set("health_path", json!(path));
            }
            if let Some(seconds) = form.initial_delay_seconds {
                set("health_timeout_s", json!(seconds));
            }
        }
        None => {}
    }
    match (service.replicas, service.replica_policy) {
        (Some(_), Some(_)) => {
            return Err(fault(
                &["service", "replica_policy"],
                "give `replicas` (a fixed count) or `replica_policy` (bounds and targets), not both".to_string(),
            ));
        }
        (Some(count), None) => {
            set("min_replicas", json!(count));
            set("max_replicas", json!(count));
        }
        (None, Some(policy)) => {
            let numbers = [
                ("min_replicas", policy.min_replicas),
                ("max_replicas", policy.max_replicas),
                ("target_in_flight", policy.target_in_flight),
                ("target_p95_ms", policy.target_p95_ms),
                ("scale_up_after_s", policy.upscale_delay_seconds),
                ("scale_down_after_s", policy.downscale_delay_seconds),
            ];
            for (key, value) in numbers {
                if let Some(value) = value {
                    set(key, json!(value));
                }
            }
            if let Some(tier) = policy.burst_tier {
                set("burst_tier", json!(tier.text));
            }
        }
        (None, None) => {}
    }
    if let Some(seconds) = service.wake_timeout {
        set("wake_timeout_s", json!(seconds.0));
    }
    Ok(fields)
}

// ------------------------------------------------------------------------------------------------
// Values read from their text (a scalar's text as written: `3.20` stays "3.20").

/// A word from a fixed list.
struct Choice<C> {
    text: String,
    kind: PhantomData<C>,
}

trait Choices {
    const ALL: &'static [&'static str];
}

macro_rules! choices {
    ($($kind:ident: $($word:literal),+;)+) => {
        $(
            struct $kind;
            impl Choices for $kind {
                const ALL: &'static [&'static str] = &[$($word),+];
            }
        )+
    };
}

choices! {
    Tiers: "gold", "silver", "bronze";
    Classes: "training", "inference", "batch", "eval";
    Topologies: "node", "nvlink", "fabric", "site", "region", "any";
    Runtimes: "container", "process";
    Networks: "none", "bridge";
    GangRepairs: "restart", "keep";
    RepairBillings: "bill", "pause";
}

impl<'de, C: Choices> Deserialize<'de> for Choice<C> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        from_text(deserializer, |text| {
            if !C::ALL.contains(&text) {
                return Err(format!("`{text}` is not one of {}", C::ALL.join(", ")));
            }
            Ok(Choice {
                text: text.to_string(),
                kind: PhantomData,
            })
        })
    }
}

/// A scalar read from its text as written, checked by `parse` while the parser is at it (so
/// that a fault is placed at the value, not at the mapping around it).
fn from_text<'de, D, T, F>(deserializer: D, parse: F) -> Result<T, D::Error>
where
    D: Deserializer<'de>,
    F: FnOnce(&str) -> Result<T, String>,
{
    struct Text<F>(F);
    impl<'de, T, F: FnOnce(&str) -> Result<T, String>> Visitor<'de> for Text<F> {
        type Value = T;
        fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
            f.write_str("a single value")
        }
        fn visit_str<E: de::Error>(self, text: &str) -> Result<T, E> {
            (self.0)(text).map_err(E::custom)
        }
    }
    deserializer.deserialize_str(Text(parse))
}

/// A whole number in `MIN..=MAX`.
struct Bounded<const MIN: u64, const MAX: u64>(u64);

impl<'de, const MIN: u64, const MAX: u64> Deserialize<'de> for Bounded<MIN, MAX> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        from_text(deserializer, |text| match text.trim().parse::<u64>() {
            Ok(value) if (MIN..=MAX).contains(&value) => Ok(Bounded(value)),
            _ => Err(format!("`{text}` is not a whole number in {MIN}–{MAX}")),
        })
    }
}

/// A decimal amount in millionths within bounds, sent as text in its normal form.
struct Decimal<K> {
    text: String,
    kind: PhantomData<K>,
}

trait Amount {
    /// The largest, in millionths.
    const MAX_MICROS: i64;
    /// What it is and its range, for errors.
    const WHAT: &'static str;
}

struct Price;
impl Amount for Price {
    const MAX_MICROS: i64 = api::PRICE_MICROS_MAX;
    const WHAT: &'static str =
        "a price in dollars per GPU-hour, more than 0 and at most 1000, with at most six decimals (e.g. 2.50)";
}

struct ComputeUnits;
impl Amount for ComputeUnits {
    const MAX_MICROS: i64 = 64_000_000;
    const WHAT: &'static str = "compute units, 0.001–64 (1.0 = one H100 SXM), e.g. 2.5";
}

impl<'de, K: Amount> Deserialize<'de> for Decimal<K> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        from_text(deserializer, |written| {
            let micros = model::Micros::parse_dollars(written)
                .map(|micros| micros.0)
                .filter(|micros| (1..=K::MAX_MICROS).contains(micros))
                .ok_or_else(|| format!("`{written}` is not {}", K::WHAT))?;
            Ok(Decimal {
                text: decimal_text(micros),
                kind: PhantomData,
            })
        })
    }
}

/// Millionths as decimal text without trailing zeros: 3_200_000 is "3.2", 8_000_000 is "8".
fn decimal_text(micros: i64) -> String {
    let whole = micros / 1_000_000;
    let fraction = micros % 1_000_000;
    if fraction == 0 {
        return whole.to_string();
    }
    let digits = format!("{fraction:06}");
    format!("{whole}.{}", digits.trim_end_matches('0'))
}

/// Cores, as thousandths: `4`, `0.5`, SkyPilot's `4+`.
struct Cpus(u32);

impl<'de> Deserialize<'de> for Cpus {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        from_text(deserializer, |written| {
            let number = written.trim().trim_end_matches('+');
            model::Micros::parse_dollars(number)
                .filter(|micros| micros.0 > 0 && micros.0 % 1000 == 0 && !number.starts_with('$'))
                .and_then(|micros| u32::try_from(micros.0 / 1000).ok())
                .map(Cpus)
                .ok_or_else(|| {
                    format!("`{written}` is not a number of cores with at most three decimals (e.g. 4 or 0.5)")
                })
        })
    }
}

/// A size as bytes: a number in `default_unit`s, or a number and a unit.
fn size_bytes(written: &str, default_unit: u128) -> Option<u128> {
    let text = written.trim().trim_end_matches('+').trim_end();
    let split = text
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let unit = match unit.trim() {
        "" => default_unit,
        "B" => 1,
        "KB" => 1_000,
        "MB" => 1_000_000,
        "GB" => 1_000_000_000,
        "TB" => 1_000_000_000_000,
        "KiB" => 1 << 10,
        "MiB" => 1 << 20,
        "GiB" => 1 << 30,
        "TiB" => 1 << 40,
        _ => return None,
    };
    let micros = model::Micros::parse_dollars(number).filter(|micros| micros.0 >= 0 && !number.is_empty())?;
    Some((micros.0 as u128 * unit).div_ceil(1_000_000))
}

const SIZE_UNITS: &str = "B, KB, MB, GB, TB, KiB, MiB, GiB or TiB";

/// Memory: a number is GiB; kept in MiB, rounded up.
struct SizeMib(u64);

impl<'de> Deserialize<'de> for SizeMib {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        from_text(deserializer, |written| {
            size_bytes(written, 1 << 30)
                .map(|bytes| bytes.div_ceil(1 << 20))
                .filter(|mib| *mib <= u128::from(api::MEMORY_MIB_MAX))
                .map(|mib| SizeMib(mib as u64))
                .ok_or_else(|| {
                    format!(
                        "`{written}` is not a size: a number of GiB (e.g. 32) or a number and a unit ({SIZE_UNITS}), at most 1 PiB"
                    )
                })
        })
    }
}

/// A dataset's size: a number is bytes.
struct SizeBytes(u64);

impl<'de> Deserialize<'de> for SizeBytes {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        from_text(deserializer, |written| {
            size_bytes(written, 1)
                .and_then(|bytes| u64::try_from(bytes).ok())
                .filter(|bytes| i64::try_from(*bytes).is_ok())
                .map(SizeBytes)
                .ok_or_else(|| {
                    format!("`{written}` is not a size: a number of bytes or a number and a unit ({SIZE_UNITS})")
                })
        })
    }
}

/// A duration: a whole number of seconds, or `90s`, `15m`, `12h`, `2d`, `1h30m`.
struct Seconds(u32);

impl<'de> Deserialize<'de> for Seconds {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        from_text(deserializer, |written| {
            let text = written.trim();
            let seconds = if !text.is_empty() && text.chars().all(|c| c.is_ascii_digit()) {
                text.parse::<u64>().map_err(|_| format!("`{written}` is too long"))
            } else {
                super::node::parse_duration_s(text)
            };
            seconds
                .and_then(|seconds| u32::try_from(seconds).map_err(|_| format!("`{written}` is too long")))
                .map(Seconds)
        })
    }
}

/// Where the agent PUTs the output archive: an http(s) URL.
struct OutputUrl(String);

impl<'de> Deserialize<'de> for OutputUrl {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        from_text(deserializer, |url| {
            if url.starts_with("http://") || url.starts_with("https://") {
                Ok(OutputUrl(url.to_string()))
            } else {
                Err(format!(
                    "`{url}` is not an http(s):// URL (the agent PUTs the output archive to it)"
                ))
            }
        })
    }
}

/// 0–1.
struct Fraction(f64);

impl<'de> Deserialize<'de> for Fraction {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        from_text(deserializer, |text| match text.trim().parse::<f64>() {
            Ok(value) if (0.0..=1.0).contains(&value) => Ok(Fraction(value)),
            _ => Err(format!("`{text}` is not a fraction from 0 to 1")),
        })
    }
}

/// `envs`: names and values in the file's order (a value left empty is refused later, where the
/// key can be named), each name once.
struct Envs(Vec<(String, Option<String>)>);

impl<'de> Deserialize<'de> for Envs {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Form;
        impl<'de> Visitor<'de> for Form {
            type Value = Envs;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a mapping of environment variables to their values")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Envs, A::Error> {
                let mut entries: Vec<(String, Option<String>)> = Vec::new();
                while let Some((key, value)) = map.next_entry::<String, Option<String>>()? {
                    if entries.iter().any(|(seen, _)| *seen == key) {
                        // `from_yaml` finds the second one from this wording.
                        return Err(de::Error::custom(format!("duplicate field `{key}`")));
                    }
                    entries.push((key, value));
                }
                Ok(Envs(entries))
            }
        }
        deserializer.deserialize_map(Form)
    }
}

/// How many GPUs of a model a replica takes.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Count {
    Whole(u8),
    /// A share of one GPU, in thousandths.
    Share(u16),
}

const COUNT_RULE: &str =
    "a whole number of GPUs 1–16 (one node's), or a share of one below 1 (0.25) with at most three decimals";

impl Count {
    fn from_text(text: &str) -> Result<Count, String> {
        let text = text.trim();
        if text.is_empty() {
            return Err(
                "no count: write `{MODEL: COUNT}` with a space after the colon, or `[MODEL:COUNT, …]`".to_string(),
            );
        }
        let micros = model::Micros::parse_dollars(text)
            .filter(|_| !text.starts_with('$'))
            .ok_or_else(|| format!("`{text}` is not {COUNT_RULE}"))?
            .0;
        Count::from_micros(micros).ok_or_else(|| match micros / 1_000_000 {
            17.. if micros % 1_000_000 == 0 => format!(
                "{text} GPUs are more than one node holds (1–16): ask for more replicas (`num_nodes`) with fewer GPUs each"
            ),
            _ => format!("`{text}` is not {COUNT_RULE}"),
        })
    }

    fn from_micros(micros: i64) -> Option<Count> {
        match micros {
            1_000..=999_000 if micros % 1_000 == 0 => Some(Count::Share((micros / 1_000) as u16)),
            1_000_000..=16_000_000 if micros % 1_000_000 == 0 => Some(Count::Whole((micros / 1_000_000) as u8)),
            _ => None,
        }
    }

    fn from_number(value: f64) -> Result<Count, String> {
        let micros = (value * 1e6).round();
        if (value * 1e6 - micros).abs() > 1e-3 || !(0.0..=1e12).contains(&micros) {
            return Err(format!("{value} is not {COUNT_RULE}"));
        }
        Count::from_text(&decimal_text(micros as i64))
    }
}

/// SkyPilot's `accelerators`: `H100:8`, `H100`, `A100:0.25`, `{H100: 8, H200: 8}`,
/// `[H100:8, H200:8]` or a count alone.
struct Accelerators {
    models: Vec<String>,
    count: Count,
}

impl Accelerators {
    fn item(text: &str) -> Result<(String, Count), String> {
        let (model, count) = match text.rsplit_once(':') {
            Some((model, count)) => (model.trim(), Count::from_text(count)?),
            None => (text.trim(), Count::Whole(1)),
        };
        if model.is_empty() {
            return Err(format!("`{text}` names no GPU model: give MODEL:COUNT, e.g. H100:8"));
        }
        Ok((model.to_string(), count))
    }

    fn of(items: Vec<(String, Count)>) -> Result<Accelerators, String> {
        let Some(&(_, count)) = items.first() else {
            return Err("no GPU model given: give MODEL:COUNT, e.g. H100:8".to_string());
        };
        if items.iter().any(|(_, other)| *other != count) {
            return Err("the models are alternatives: give them one count (e.g. [H100:8, H200:8])".to_string());
        }
        let mut models: Vec<String> = Vec::new();
        for (model, _) in items {
            if !models.contains(&model) {
                models.push(model);
            }
        }
        Ok(Accelerators { models, count })
    }
}

/// A count in an `accelerators` mapping, from its text.
struct CountValue(Count);

impl<'de> Deserialize<'de> for CountValue {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        from_text(deserializer, |text| Count::from_text(text).map(CountValue))
    }
}

impl<'de> Deserialize<'de> for Accelerators {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Form;
        impl<'de> Visitor<'de> for Form {
            type Value = Accelerators;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str(
                    "MODEL:COUNT (e.g. H100:8), a mapping of models to one count, a list of MODEL:COUNT, or a count",
                )
            }
            fn visit_str<E: de::Error>(self, text: &str) -> Result<Accelerators, E> {
                Accelerators::item(text)
                    .and_then(|item| Accelerators::of(vec![item]))
                    .map_err(E::custom)
            }
            fn visit_u64<E: de::Error>(self, count: u64) -> Result<Accelerators, E> {
                Count::from_text(&count.to_string())
                    .map(|count| Accelerators {
                        models: Vec::new(),
                        count,
                    })
                    .map_err(E::custom)
            }
            fn visit_i64<E: de::Error>(self, count: i64) -> Result<Accelerators, E> {
                Err(E::custom(format!("{count} is not {COUNT_RULE}")))
            }
            fn visit_f64<E: de::Error>(self, count: f64) -> Result<Accelerators, E> {
                Count::from_number(count)
                    .map(|count| Accelerators {
                        models: Vec::new(),
                        count,
                    })
                    .map_err(E::custom)
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Accelerators, A::Error> {
                let mut items = Vec::new();
                while let Some((model, count)) = map.next_entry::<String, CountValue>()? {
                    items.push((model, count.0));
                }
                Accelerators::of(items).map_err(de::Error::custom)
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Accelerators, A::Error> {
                let mut items = Vec::new();
                while let Some(word) = seq.next_element::<String>()? {
                    items.push(Accelerators::item(&word).map_err(de::Error::custom)?);
                }
                Accelerators::of(items).map_err(de::Error::custom)
            }
        }
        deserializer.deserialize_any(Form)
    }
}

/// `regions`: one or a list.
struct Regions(Vec<String>);

impl<'de> Deserialize<'de> for Regions {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Form;
        impl<'de> Visitor<'de> for Form {
            type Value = Regions;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a region or a list of regions")
            }
            fn visit_str<E: de::Error>(self, region: &str) -> Result<Regions, E> {
                Ok(Regions(vec![region.to_string()]))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<Regions, A::Error> {
                Vec::<String>::deserialize(SeqAccessDeserializer::new(seq)).map(Regions)
            }
        }
        deserializer.deserialize_any(Form)
    }
}

/// `ports`: one port, alone or in a list (a replica serves one).
struct Port(u16);

impl<'de> Deserialize<'de> for Port {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Form;
        const RULE: &str = "a port, 1–65535 (a replica serves one)";
        impl<'de> Visitor<'de> for Form {
            type Value = Port;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str(RULE)
            }
            fn visit_u64<E: de::Error>(self, port: u64) -> Result<Port, E> {
                u16::try_from(port)
                    .ok()
                    .filter(|port| *port > 0)
                    .map(Port)
                    .ok_or_else(|| E::custom(format!("{port} is not {RULE}")))
            }
            fn visit_i64<E: de::Error>(self, port: i64) -> Result<Port, E> {
                Err(E::custom(format!("{port} is not {RULE}")))
            }
            fn visit_str<E: de::Error>(self, text: &str) -> Result<Port, E> {
                match text.trim().parse::<u64>() {
                    Ok(port) => self.visit_u64(port),
                    Err(_) => Err(E::custom(format!("`{text}` is not {RULE}"))),
                }
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Port, A::Error> {
                let Some(port) = seq.next_element::<Port>()? else {
                    return Err(de::Error::custom(format!("an empty list is not {RULE}")));
                };
                if seq.next_element::<de::IgnoredAny>()?.is_some() {
                    return Err(de::Error::custom(format!("give one port: {RULE}")));
                }
                Ok(port)
            }
        }
        deserializer.deserialize_any(Form)
    }
}

/// `readiness_probe`: a path, or `path` and `initial_delay_seconds`.
enum Probe {
    Path(String),
    Form(ProbeForm),
}

impl<'de> Deserialize<'de> for Probe {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Form;
        impl<'de> Visitor<'de> for Form {
            type Value = Probe;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("an HTTP path (e.g. /health) or a mapping of `path` and `initial_delay_seconds`")
            }
            fn visit_str<E: de::Error>(self, path: &str) -> Result<Probe, E> {
                Ok(Probe::Path(path.to_string()))
            }
            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Probe, A::Error> {
                ProbeForm::deserialize(MapAccessDeserializer::new(map)).map(Probe::Form)
            }
        }
        deserializer.deserialize_any(Form)
    }
}

/// A dataset: `url`, `digest` and `size`, or `URL,DIGEST,SIZE_BYTES` as `--dataset` takes it.
struct Dataset {
    url: String,
    digest: String,
    size_bytes: u64,
}

impl<'de> Deserialize<'de> for Dataset {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Form;
        impl<'de> Visitor<'de> for Form {
            type Value = Dataset;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a mapping of `url`, `digest` and `size`, or URL,DIGEST,SIZE_BYTES")
            }
            fn visit_str<E: de::Error>(self, text: &str) -> Result<Dataset, E> {
                let dataset = super::job::parse_dataset(text).map_err(E::custom)?;
                Ok(Dataset {
                    url: dataset.url,
                    digest: dataset.digest,
                    size_bytes: dataset.size_bytes,
                })
            }
            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Dataset, A::Error> {
                let form = DatasetForm::deserialize(MapAccessDeserializer::new(map))?;
                if api::dataset_content_id(form.digest.trim()).is_none() {
                    return Err(de::Error::custom(format!(
                        "dataset digest `{}` is not blake3:<64 hex> or sha256:<64 hex>",
                        form.digest
                    )));
                }
                Ok(Dataset {
                    url: form.url,
                    digest: form.digest,
                    size_bytes: form.size.0,
                })
            }
        }
        deserializer.deserialize_any(Form)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job(text: &str) -> Map<String, Value> {
        match parse(text, Purpose::Job) {
            Ok(file) => file.job,
            Err(fault) => panic!("{fault}\nin:\n{text}"),
        }
    }

    fn refused(text: &str, purpose: Purpose) -> FileError {
        match parse(text, purpose) {
            Ok(file) => panic!("accepted: {:?}\nin:\n{text}", file.job),
            Err(fault) => fault,
        }
    }

    #[test]
    fn a_skypilot_style_file_becomes_the_api_request() {
        let text = "\
name: finetune
resources:
  accelerators: H100:8
  cpus: 32
  memory: 256
  gpu_memory: 80GiB
  image_id: docker:pytorch/pytorch:2.5
  regions: [eu-west, us-east]
  topology: nvlink
  min_reliability: 0.9
num_nodes: 2
tier: gold
max_price: 3.20
preemptible: false
class: training
max_runtime: 12h
envs:
  EPOCHS: 3.0
  DEBUG: yes
datasets:
  - url: https://data.example.com/corpus.tar
    digest: blake3:9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08
    size: 1.5GiB
  - https://data.example.com/b.tar,sha256:9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08,10
checkpoint:
  dir: /ckpt
  interval: 15m
gang:
  repair: keep
  max_restarts: 5
  repair_billing: pause
network: bridge
client_token: run-7
reservation: 4
setup: |
  pip install -r requirements.txt
run: |
  torchrun train.py
";
        let digest = "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08";
        let expected = json!({
            "name": "finetune",
            "gpu_models": ["H100"],
            "gpus": 8,
            "cpu_milli": 32000,
            "memory_mib": 262144,
            "gpu_memory_mib_min": 81920,
            "image": "pytorch/pytorch:2.5",
            "regions": ["eu-west", "us-east"],
            "topology": "nvlink",
            "min_reliability": 0.9,
            "replicas": 2,
            "tier": "gold",
            "max_price_per_gpu_hour": "3.2",
            "preemptible": false,
            "class": "training",
            "max_runtime_s": 43200,
            "env": {"EPOCHS": "3.0", "DEBUG": "yes"},
            "datasets": [
                {"url": "https://data.example.com/corpus.tar", "digest": format!("blake3:{digest}"), "size_bytes": 1610612736u64},
                {"url": "https://data.example.com/b.tar", "digest": format!("sha256:{digest}"), "size_bytes": 10},
            ],
            "checkpoint_dir": "/ckpt",
            "checkpoint_interval_s": 900,
            "gang_repair": "keep",
            "max_restarts": 5,
            "repair_billing": "pause",
            "network": "bridge",
            "client_token": "run-7",
            "reservation": 4,
            "command": ["sh", "-c", "set -e\npip install -r requirements.txt\nset +e\ntorchrun train.py\n"],
        });
        assert_eq!(Value::Object(job(text)), expected);
        // What it says is what the API takes.
        let request: api::JobRequest = serde_json::from_value(expected).expect("a JobRequest");
        assert_eq!(request.gpus, Some(8));
    }

    #[test]
    fn accelerators_take_skypilots_forms() {
        let cases = [
            ("H100:8", json!({"gpu_models": ["H100"], "gpus": 8})),
            ("H100", json!({"gpu_models": ["H100"], "gpus": 1})),
            ("A100:0.25", json!({"gpu_models": ["A100"], "gpu_share_milli": 250})),
            ("{H100: 8, H200: 8}", json!({"gpu_models": ["H100", "H200"], "gpus": 8})),
            (
                "[H100:4, H200:4, H100:4]",
                json!({"gpu_models": ["H100", "H200"], "gpus": 4}),
            ),
            ("2", json!({"gpus": 2})),
            ("0.5", json!({"gpu_share_milli": 500})),
        ];
        for (written, expected) in cases {
            let got = job(&format!("resources:\n  accelerators: {written}\n"));
            assert_eq!(Value::Object(got), expected, "accelerators: {written}");
        }
        for (written, why) in [
            ("H100:17", "more than one node holds"),
            ("H100:0", "is not a whole number"),
            ("H100:1.5", "is not a whole number"),
            ("H100:0.0005", "is not a whole number"),
            ("{H100: 8, H200: 4}", "one count"),
            (":8", "names no GPU model"),
            ("[]", "no GPU model"),
            ("-1", "is not a whole number"),
        ] {
            let fault = refused(&format!("resources:\n  accelerators: {written}\n"), Purpose::Job);
            assert!(fault.message.contains(why), "accelerators: {written}: {fault}");
            assert_eq!(fault.line, 2, "accelerators: {written}: {fault}");
        }
    }

    #[test]
    fn sizes_durations_cpus_and_prices_have_units_and_normal_forms() {
        let cases = [
            ("resources: {memory: 512MiB}", "memory_mib", json!(512)),
            ("resources: {memory: 32+}", "memory_mib", json!(32768)),
            ("resources: {memory: 1GB}", "memory_mib", json!(954)),
            ("resources: {memory: 0.5}", "memory_mib", json!(512)),
            ("resources: {cpus: 0.5}", "cpu_milli", json!(500)),
            ("resources: {cpus: 4+}", "cpu_milli", json!(4000)),
            ("resources: {compute_units: 2.50}", "compute_units", json!("2.5")),
            ("max_price: \"$3\"", "max_price_per_gpu_hour", json!("3")),
            ("max_price: 0.000001", "max_price_per_gpu_hour", json!("0.000001")),
            ("max_runtime: 90", "max_runtime_s", json!(90)),
            ("max_runtime: 1h30m", "max_runtime_s", json!(5400)),
            ("max_runtime: 2d", "max_runtime_s", json!(172800)),
        ];
        for (text, key, expected) in cases {
            assert_eq!(job(text).get(key), Some(&expected), "{text}");
        }
        for text in [
            "resources: {memory: 32 GB of it}",
            "resources: {memory: -1}",
            "resources: {cpus: 0.0001}",
            "resources: {cpus: 0}",
            "max_price: 0",
            "max_price: 1000.5",
            "max_price: 1.0000001",
            "max_runtime: 2 weeks",
            "max_runtime: 9999999999",
            "resources: {min_reliability: 1.5}",
            "num_nodes: 0",
            "num_nodes: 5000",
            "reservation: 0",
            "reservation: next-tuesday",
            "tier: platinum",
            "resources: {topology: rack}",
            "preemptible: yes",
        ] {
            let fault = refused(text, Purpose::Job);
            assert_eq!(fault.line, 1, "{text}: {fault}");
        }
    }

    #[test]
    fn unknown_keys_are_refused_where_they_are_with_fallows_form() {
        let fault = refused(
            "name: x\nresources:\n  accelerators: H100:1\n  use_spot: true\n",
            Purpose::Job,
        );
        assert_eq!((fault.line, fault.column), (4, 3), "{fault}");
        assert!(fault.message.contains("unknown key `use_spot` in resources"), "{fault}");
        assert!(fault.message.contains("tier: bronze"), "{fault}");
        let fault = refused("name: x\nrun: echo\nfile_mounts:\n  /data: s3://b\n", Purpose::Job);
        assert_eq!((fault.line, fault.column), (3, 1), "{fault}");
        assert!(
            fault.message.contains("at the top level") && fault.message.contains("datasets"),
            "{fault}"
        );
        let fault = refused("tier: gold\nflavour: mint\n", Purpose::Job);
        assert_eq!((fault.line, fault.column), (2, 1), "{fault}");
        assert!(fault.message.contains("the keys here are"), "{fault}");
        let fault = refused("envs:\n  A: 1\n  B:\n", Purpose::Job);
        assert_eq!(fault.line, 3, "{fault}");
        assert!(fault.message.contains("--env"), "{fault}");
        for text in ["", "# nothing\n", "- a\n- b\n", "just words\n"] {
            let fault = refused(text, Purpose::Job);
            assert_eq!((fault.line, fault.column), (1, 1), "{text:?}: {fault}");
        }
        let fault = refused("name: a\nname: b\n", Purpose::Job);
        assert!(fault.message.contains("duplicate"), "{fault}");
    }

    #[test]
    fn keys_that_cannot_go_together_are_refused_at_the_key_the_rules_name() {
        let cases = [
            ("run: a\ncommand: [b]\n", Purpose::Job, (2, 1), "not both"),
            ("setup: a\n", Purpose::Job, (1, 1), "needs `run`"),
            (
                "name: x\nresources:\n  accelerators: H100\n  compute_units: 2\n",
                Purpose::Job,
                (4, 3),
                "not both",
            ),
            (
                "runtime: process\nresources:\n  image_id: x\nrun: a\n",
                Purpose::Job,
                (3, 3),
                "drop `image_id`",
            ),
            ("name: x\nruntime: process\n", Purpose::Job, (2, 1), "needs `run`"),
            (
                "name: x\nservice:\n  replicas: 2\n",
                Purpose::Job,
                (2, 1),
                "service deploy",
            ),
            (
                "name: x\nresources:\n  ports: 8080\n",
                Purpose::Job,
                (3, 3),
                "service deploy",
            ),
            ("name: x\nnum_nodes: 2\n", Purpose::Service, (2, 1), "service.replicas"),
            (
                "name: x\nreservation: 3\n",
                Purpose::Service,
                (2, 1),
                "not inside a booking",
            ),
            (
                "service:\n  replicas: 2\n  replica_policy:\n    min_replicas: 1\n",
                Purpose::Service,
                (3, 3),
                "not both",
            ),
        ];
        for (text, purpose, at, why) in cases {
            let fault = refused(text, purpose);
            assert_eq!((fault.line, fault.column), at, "{text}: {fault}");
            assert!(fault.message.contains(why), "{text}: {fault}");
        }
    }

    #[test]
    fn a_process_job_runs_its_script_with_sh_or_its_command() {
        let got = job("runtime: process\nsetup: a\nrun: b\n");
        assert_eq!(got["image"], json!("sh"));
        assert_eq!(got["command"], json!(["-c", "set -e\na\nset +e\nb"]));
        assert_eq!(got["runtime"], json!("process"));
        let got = job("runtime: process\ncommand: [python3, eval.py, --seed, 1]\n");
        assert_eq!(got["image"], json!("python3"));
        assert_eq!(got["command"], json!(["eval.py", "--seed", "1"]));
        let got = job("resources: {image_id: busybox}\ncommand: [echo, hi]\n");
        assert_eq!(
            (&got["image"], &got["command"]),
            (&json!("busybox"), &json!(["echo", "hi"]))
        );
        assert!(!got.contains_key("runtime"));
        let got = job("resources: {image_id: busybox}\n");
        assert!(!got.contains_key("command"), "the image's own command runs");
    }

    #[test]
    fn a_service_file_gives_the_service_and_its_replica() {
        let text = "\
name: chat
resources:
  accelerators: L4:1
  ports: 8000
tier: silver
max_price: 1.5
run: python3 -m http.server $PORT
service:
  readiness_probe:
    path: /health
    initial_delay_seconds: 120
  replica_policy:
    min_replicas: 1
    max_replicas: 4
    target_in_flight: 8
    target_p95_ms: 500
    burst_tier: bronze
    upscale_delay_seconds: 20
    downscale_delay_seconds: 300
  wake_timeout: 2m
";
        let file = parse(text, Purpose::Service).expect("a service file");
        let service = file.service.expect("the service's fields");
        assert_eq!(
            Value::Object(service),
            json!({
                "name": "chat", "port": 8000, "health_path": "/health", "health_timeout_s": 120,
                "min_replicas": 1, "max_replicas": 4, "target_in_flight": 8, "target_p95_ms": 500,
                "scale_up_after_s": 20, "scale_down_after_s": 300, "burst_tier": "bronze",
                "wake_timeout_s": 120,
            })
        );
        assert_eq!(file.job["tier"], json!("silver"));
        let fixed = parse(
            "service:\n  name: web\n  replicas: 3\n  readiness_probe: /ready\n",
            Purpose::Service,
        )
        .expect("a service file")
        .service
        .expect("the service's fields");
        assert_eq!(
            Value::Object(fixed),
            json!({"name": "web", "min_replicas": 3, "max_replicas": 3, "health_path": "/ready"})
        );
        let fault = refused(
            "service:\n  replica_policy:\n    target_qps_per_replica: 5\n",
            Purpose::Service,
        );
        assert_eq!((fault.line, fault.column), (3, 5), "{fault}");
        assert!(fault.message.contains("target_in_flight"), "{fault}");
    }

    #[test]
    fn the_word_lists_are_the_models() {
        let names = |all: &[&str]| all.join(",");
        assert_eq!(names(Tiers::ALL), model::Tier::ALL.map(|tier| tier.name()).join(","));
        assert_eq!(
            names(Classes::ALL),
            model::WorkloadClass::ALL.map(|class| class.name()).join(",")
        );
        assert_eq!(
            names(Topologies::ALL),
            model::TopologyLevel::ALL.map(|level| level.name()).join(",")
        );
        assert_eq!(
            names(Runtimes::ALL),
            model::Runtime::ALL.map(|runtime| runtime.name()).join(",")
        );
    }

    #[test]
    fn keys_are_located_in_block_mappings() {
        let text = "a: 1\nb:\n  c: 2\n  d:\n    e: 3\nc: 4\nlist:\n  - x: 1\n";
        assert_eq!(locate(text, &["c"]), (6, 1));
        assert_eq!(locate(text, &["b", "c"]), (3, 3));
        assert_eq!(locate(text, &["b", "d", "e"]), (5, 5));
        assert_eq!(locate(text, &["missing"]), (1, 1));
        assert_eq!(locate(text, &["list", "x"]), (8, 5));
    }
}
