//! Checks wire requests and turns them into the model's types. Every refusal says which field
//! is wrong and what would be right.

use model::{
    ClientLocation, Dataset, GpuCatalog, GpuDemand, JobId, JobSpec, Micros, RegionId, ReplicaResources, Runtime,
    TenantId, Tier, TopologyLevel,
};

use crate::{
    COMMAND_ARGS_MAX, DATASETS_MAX, ENV_ENTRIES_MAX, JobRequest, MEMORY_MIB_MAX, PRICE_MICROS_MAX, REGIONS_MAX,
    REPLICAS_MAX, RUNTIME_S_MAX, TEXT_FIELD_BYTES_MAX, parse_class,
};

/// The most whole GPUs one replica may take: the GPUs of one node.
const GPUS_PER_REPLICA_MAX: u8 = model::GPUS_PER_NODE_MAX as u8;

/// A request that cannot be served as given; the message names the field.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct InputError(pub String);

fn bad<T>(message: impl Into<String>) -> Result<T, InputError> {
    Err(InputError(message.into()))
}

fn text(field: &str, value: &str) -> Result<(), InputError> {
    if value.len() > TEXT_FIELD_BYTES_MAX {
        return bad(format!("{field}: longer than {TEXT_FIELD_BYTES_MAX} bytes"));
    }
    if value.chars().any(|c| c == '\0') {
        return bad(format!("{field}: contains a NUL character"));
    }
    Ok(())
}

pub fn parse_topology(text: &str) -> Option<TopologyLevel> {
    TopologyLevel::ALL.into_iter().find(|level| level.name() == text)
}

/// The 64-bit content id the matcher uses for a dataset digest ("blake3:<hex>" or "sha256:<hex>").
pub fn dataset_content_id(digest: &str) -> Option<u64> {
    let (algorithm, hex) = digest.split_once(':')?;
    if !matches!(algorithm, "blake3" | "sha256") || hex.len() != 64 || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    u64::from_str_radix(&hex[..16], 16).ok()
}

impl JobRequest {
    /// Checks the request and builds the matcher's job. `region` maps a region name to the
    /// matcher's id (None for a region no node is in: the job is valid but cannot be placed there).
    pub fn to_spec(
        &self,
        id: i64,
        tenant: i64,
        submitted_at_s: i64,
        region: impl Fn(&str) -> Option<RegionId>,
    ) -> Result<JobSpec, InputError> {
        let catalog = GpuCatalog::embedded();
        text("name", &self.name)?;
        if self.image.trim().is_empty() {
            return bad("image: give a container image (e.g. \"busybox:latest\") or a program path");
        }
        text("image", &self.image)?;
        if self.command.len() > COMMAND_ARGS_MAX {
            return bad(format!("command: at most {COMMAND_ARGS_MAX} arguments"));
        }
        for arg in &self.command {
            text("command", arg)?;
        }
        if self.env.len() > ENV_ENTRIES_MAX {
            return bad(format!("env: at most {ENV_ENTRIES_MAX} entries"));
        }
        for (key, value) in &self.env {
            if key.is_empty() || key.contains('=') {
                return bad(format!("env: {key:?} is not a variable name"));
            }
            text("env", value)?;
        }
        let gpu = match (self.gpus, self.gpu_share_milli, &self.compute_units) {
            (None, None, None) => GpuDemand::None,
            (Some(count), None, None) if (1..=GPUS_PER_REPLICA_MAX).contains(&count) => GpuDemand::Whole { count },
            (Some(0), None, None) => {
                return bad(format!(
                    "gpus: 0 is not 1–{GPUS_PER_REPLICA_MAX} (GPUs of one node per replica; leave it out for a CPU-only job)"
                ));
            }
            (Some(count), None, None) => {
                // A replica runs on one node; more GPUs than a node holds is a gang of 8-GPU
                // replicas (the common board), as many as the GPUs asked for in all.
                let per_replica = 8;
                return bad(format!(
                    "gpus: {count} is more than one node holds (1–{GPUS_PER_REPLICA_MAX}); ask for more replicas \
                     instead (\"replicas\": {}, \"gpus\": {per_replica})",
                    self.replicas
                        .max(1)
                        .saturating_mul(u32::from(count).div_ceil(per_replica))
                ));
            }
            (None, Some(milli), None) if (1..1000).contains(&milli) => GpuDemand::Share { milli },
            (None, Some(milli), None) => {
                return bad(format!(
                    "gpu_share_milli: {milli} is not 1–999 (use gpus for whole GPUs)"
                ));
            }
            (None, None, Some(units)) => {
                let micros = Micros::parse_dollars(units)
                    .filter(|value| value.0 > 0 && value.0 <= 64_000_000)
                    .ok_or_else(|| {
                        InputError(format!("compute_units: {units:?} is not a number between 0.001 and 64"))
                    })?;
                GpuDemand::ComputeUnits {
                    cu_milli: (micros.0 / 1000).max(1) as u32,
                }
            }
            _ => return bad("give at most one of gpus, gpu_share_milli and compute_units"),
        };
        let mut gpu_models = Vec::with_capacity(self.gpu_models.len());
        for name in &self.gpu_models {
            let model = catalog
                .find_or_explain(name)
                .map_err(|unknown| InputError(format!("gpu_models: {unknown}")))?;
            gpu_models.push(model);
        }
        if !(1..=REPLICAS_MAX).contains(&self.replicas) {
            return bad(format!("replicas: {} is not 1–{REPLICAS_MAX}", self.replicas));
        }
        let topology = parse_topology(&self.topology).ok_or_else(|| {
            InputError(format!(
                "topology: {:?} is not node, nvlink, fabric, site, region or any",
                self.topology
            ))
        })?;
        let tier = Tier::parse(&self.tier)
            .ok_or_else(|| InputError(format!("tier: {:?} is not gold, silver or bronze", self.tier)))?;
        let class = parse_class(&self.class).ok_or_else(|| {
            InputError(format!(
                "class: {:?} is not training, inference, batch or eval",
                self.class
            ))
        })?;
        let max_price = Micros::parse_dollars(&self.max_price_per_gpu_hour)
            .filter(|price| price.0 > 0 && price.0 <= PRICE_MICROS_MAX)
            .ok_or_else(|| {
                InputError(format!(
                    "max_price_per_gpu_hour: {:?} is not a price in dollars between 0.000001 and 1000 (e.g. \"2.50\")",
                    self.max_price_per_gpu_hour
                ))
            })?;
        if self.regions.len() > REGIONS_MAX {
            return bad(format!("regions: at most {REGIONS_MAX}"));
        }
        let mut regions = Vec::with_capacity(self.regions.len());
        for name in &self.regions {
            text("regions", name)?;
            regions.push(region(name).unwrap_or(RegionId(u16::MAX)));
        }
        if self.datasets.len() > DATASETS_MAX {
            return bad(format!("datasets: at most {DATASETS_MAX}"));
        }
        if self.memory_mib > MEMORY_MIB_MAX {
            return bad(format!(
                "memory_mib: {} is more than any node holds (at most 2^40)",
                self.memory_mib
            ));
        }
        let mut datasets = Vec::with_capacity(self.datasets.len());
        for dataset in &self.datasets {
            text("datasets.url", &dataset.url)?;
            if dataset.size_bytes > i64::MAX as u64 {
                return bad("datasets.size_bytes: at most 2^63 - 1");
            }
            if !(dataset.url.starts_with("http://")
                || dataset.url.starts_with("https://")
                || dataset.url.starts_with("file://"))
            {
                return bad(format!(
                    "datasets.url: {:?} is not an http(s):// or file:// URL",
                    dataset.url
                ));
            }
            let content_hash = dataset_content_id(&dataset.digest).ok_or_else(|| {
                InputError(format!(
                    "datasets.digest: {:?} is not \"blake3:<64 hex>\" or \"sha256:<64 hex>\"",
                    dataset.digest
                ))
            })?;
            datasets.push(Dataset {
                content_hash,
                size_bytes: dataset.size_bytes,
            });
        }
        let client = match &self.client {
            None => None,
            Some(client) => {
                if !(-90.0..=90.0).contains(&client.latitude) || !(-180.0..=180.0).contains(&client.longitude) {
                    return bad("client: latitude must be −90…90 and longitude −180…180");
                }
                if client.latency_target_ms == 0 {
                    return bad("client.latency_target_ms: must be positive");
                }
                Some(ClientLocation {
                    latitude: client.latitude,
                    longitude: client.longitude,
                    latency_target_ms: client.latency_target_ms,
                })
            }
        };
        if !(0.0..=1.0).contains(&self.min_reliability) {
            return bad(format!(
                "min_reliability: {} is not between 0 and 1",
                self.min_reliability
            ));
        }
        if !(1..=RUNTIME_S_MAX).contains(&self.max_runtime_s) {
            return bad(format!(
                "max_runtime_s: {} is not 1–{RUNTIME_S_MAX}",
                self.max_runtime_s
            ));
        }
        if let Some(id) = self.reservation
            && id < 1
        {
            return bad(format!("reservation: {id} is not a reservation's id (1 or more)"));
        }
        if let Some(url) = &self.output_url {
            text("output_url", url)?;
            if !(url.starts_with("http://") || url.starts_with("https://")) {
                return bad(format!("output_url: {url:?} is not an http(s):// URL"));
            }
        }
        if let Some(dir) = &self.checkpoint_dir {
            text("checkpoint_dir", dir)?;
            if !dir.starts_with('/') || dir.split('/').any(|part| part == "..") {
                return bad("checkpoint_dir: give an absolute path inside the container without \"..\"");
            }
        }
        if !matches!(self.network.as_str(), "none" | "bridge") {
            return bad(format!("network: {:?} is not none or bridge", self.network));
        }
        if let Some(mode) = &self.gang_repair
            && !matches!(mode.as_str(), "restart" | "keep")
        {
            return bad(format!("gang_repair: {mode:?} is not restart or keep"));
        }
        if let Some(serve) = &self.serve {
            crate::check_service_name("serve.name", &serve.name)?;
            if !serve.health_path.is_empty() && !serve.health_path.starts_with('/') {
                return bad("serve.health_path: a path starting with '/'");
            }
            text("serve.health_path", &serve.health_path)?;
            if self.replicas > 1 {
                return bad(
                    "serve: a serving job has one replica; deploy more jobs of the same serve.name to serve together",
                );
            }
        }
        if let Some(mode) = &self.repair_billing
            && !matches!(mode.as_str(), "bill" | "pause")
        {
            return bad(format!("repair_billing: {mode:?} is not bill or pause"));
        }
        if self.max_restarts.is_some_and(|restarts| restarts > 100) {
            return bad("max_restarts: at most 100");
        }
        // Control characters too: PostgreSQL cannot store a NUL, and a token is typed, not binary.
        if let Some(token) = &self.client_token
            && (token.is_empty() || token.len() > 128 || token.chars().any(char::is_control))
        {
            return bad("client_token: give 1–128 printable characters");
        }
        let runtime = match self.runtime.as_deref() {
            None => None,
            Some(text) => match Runtime::parse(text) {
                Some(runtime) => Some(runtime),
                None => return bad(format!("runtime: {text:?} is not container or process")),
            },
        };
        Ok(JobSpec {
            id: JobId(id as u64),
            tenant: TenantId(tenant as u32),
            tier,
            class,
            replicas: self.replicas,
            resources: ReplicaResources {
                gpu,
                gpu_memory_mib_min: self.gpu_memory_mib_min,
                gpu_models,
                cpu_milli: self.cpu_milli,
                memory_mib: self.memory_mib,
            },
            topology,
            max_price,
            preemptible: self.preemptible || tier == Tier::Bronze,
            regions,
            datasets,
            client,
            reliability_min_ppm: (self.min_reliability * 1e6).round() as u32,
            max_runtime_s: self.max_runtime_s,
            checkpoint_interval_s: self.checkpoint_interval_s,
            submitted_at: submitted_at_s,
            runtime,
            avoid_nodes: Vec::new(),
            reservation: None,
            only_nodes: Vec::new(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(json: &str) -> Result<JobSpec, String> {
        let request: JobRequest = serde_json::from_str(json).map_err(|error| error.to_string())?;
        request
            .to_spec(1, 2, 0, |name| (name == "eu-west").then_some(RegionId(0)))
            .map_err(|error| error.0)
    }

    #[test]
    fn a_full_job_converts() {
        let job = spec(
            r#"{"image": "busybox", "gpus": 8, "replicas": 4, "topology": "fabric", "tier": "gold",
                "max_price_per_gpu_hour": "2.50", "regions": ["eu-west", "mars"], "gpu_models": ["H100-SXM5"],
                "datasets": [{"url": "https://data.example/x", "digest": "blake3:00000000000000ff00000000000000000000000000000000000000000000abcd", "size_bytes": 10}],
                "min_reliability": 0.95, "max_runtime_s": 7200}"#,
        )
        .unwrap();
        assert_eq!(job.resources.gpu, GpuDemand::Whole { count: 8 });
        assert_eq!(job.replicas, 4);
        assert_eq!(job.topology, TopologyLevel::Fabric);
        assert_eq!(job.max_price, Micros(2_500_000));
        assert_eq!(job.regions, vec![RegionId(0), RegionId(u16::MAX)]);
        assert_eq!(job.datasets[0].content_hash, 0xff);
        assert_eq!(job.reliability_min_ppm, 950_000);
        assert!(!job.preemptible);
    }

    #[test]
    fn bad_jobs_say_what_is_wrong() {
        let base = r#""image": "busybox", "tier": "silver", "max_price_per_gpu_hour": "2""#;
        for (extra, says) in [
            (r#", "gpus": 0"#, "gpus: 0"),
            (
                r#", "gpus": 64"#,
                r#"gpus: 64 is more than one node holds (1–16); ask for more replicas instead ("replicas": 8, "gpus": 8)"#,
            ),
            (r#", "gpus": 300"#, "invalid value"),
            (r#", "gpus": 2, "gpu_share_milli": 500"#, "at most one"),
            (r#", "gpu_share_milli": 1000"#, "1–999"),
            (r#", "replicas": 0"#, "replicas"),
            (r#", "topology": "galaxy""#, "topology"),
            (r#", "gpu_models": ["Voodoo2"]"#, "unknown model"),
            (r#", "min_reliability": 1.5"#, "min_reliability"),
            (r#", "max_runtime_s": 0"#, "max_runtime_s"),
            (r#", "checkpoint_dir": "../etc""#, "checkpoint_dir"),
            (r#", "network": "host""#, "network"),
            (
                r#", "datasets": [{"url": "ftp://x", "digest": "blake3:00", "size_bytes": 1}]"#,
                "datasets.url",
            ),
            (r#", "surprise": true"#, "unknown field"),
            (r#", "gpus": "two""#, "invalid type"),
        ] {
            let error = spec(&format!("{{{base}{extra}}}")).unwrap_err();
            assert!(error.contains(says), "{extra}: {error}");
        }
        for (field, value, says) in [
            ("tier", "\"platinum\"", "tier"),
            ("max_price_per_gpu_hour", "\"-3\"", "max_price"),
            ("max_price_per_gpu_hour", "\"99999\"", "max_price"),
            ("image", "\"\"", "image"),
        ] {
            let json = base.replace(
                &format!("\"{field}\": "),
                &format!("\"{field}\": {value}, \"x_{field}\": "),
            );
            let json = json
                .replace(&format!(", \"x_{field}\": "), ", \"ignored\": ")
                .replace(", \"ignored\": \"busybox\"", "")
                .replace(", \"ignored\": \"silver\"", "")
                .replace(", \"ignored\": \"2\"", "");
            let error = spec(&format!("{{{json}}}")).unwrap_err();
            assert!(error.contains(says), "{field}={value}: {error}");
        }
    }
}
