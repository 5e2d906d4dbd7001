//! `fallow service deploy|list|show|update|scale|delete|logs`: long-running services behind the
//! gateway (`/s/NAME/…`). A service's replica is a job, given with `job submit`'s flags; the
//! service's own flags give its port, health check, bounds, targets and windows.

use std::io::Write;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, bail};
use api::{ServiceList, ServiceLogs, ServiceView};
use clap::{Args, Subcommand};
use reqwest::Method;
use serde_json::{Map, Value, json};

use super::job::SpecArgs;
use super::job_file::{JobFile, Purpose};
use super::output;
use super::{Client, Connection, parse};

#[derive(Args)]
pub struct ServiceArgs {
    #[command(flatten)]
    connection: Connection,
    #[command(subcommand)]
    command: ServiceCommand,
}

#[derive(Subcommand)]
enum ServiceCommand {
    /// Deploy a service: a service file (YAML with a `service` section, docs/job-files.md), or
    /// `--name`, the replica as `job submit` takes it (image or `--process` and the command
    /// after `--`, GPUs, tier, price cap, regions) and the service's flags; flags win.
    Deploy {
        #[command(flatten)]
        spec: SpecArgs,
        #[command(flatten)]
        service: ServiceFlags,
        /// Print the request (the API's ServiceRequest as JSON) and deploy nothing; needs no key.
        #[arg(long)]
        dry_run: bool,
    },
    /// Your services: replicas, requests/s, p95, tokens.
    List,
    /// A service: version, replicas and their states, requests, errors, p50/p95/p99, tokens,
    /// cost per million tokens.
    Show {
        /// The service's name.
        name: String,
    },
    /// A new spec for a service (`--name` or the service file names it; a service file gives a
    /// new replica and the settings it names; flags change what they give): a changed replica,
    /// port or health check rolls out one replica at a time; a version that never becomes
    /// healthy stops and the old replicas serve on.
    Update {
        #[command(flatten)]
        spec: SpecArgs,
        #[command(flatten)]
        service: ServiceFlags,
    },
    /// New bounds for a service's replicas.
    Scale {
        name: String,
        #[arg(long = "min-replicas", value_name = "N")]
        min_replicas: u32,
        #[arg(long = "max-replicas", value_name = "N")]
        max_replicas: Option<u32>,
    },
    /// Delete a service: its replicas stop and their escrow is released.
    Delete { name: String },
    /// Keys that call one service through the gateway and nothing else.
    Key {
        #[command(subcommand)]
        command: KeyCommand,
    },
    /// The output of a service's live replicas, each line's replica (job id) first.
    Logs {
        name: String,
        /// Keep printing new output until interrupted.
        #[arg(long)]
        follow: bool,
    },
}

#[derive(Subcommand)]
enum KeyCommand {
    /// A new key for the service, shown once.
    Create { name: String },
    /// Revoke a key of the service.
    Revoke {
        name: String,
        #[arg(value_name = "KEY_ID")]
        key_id: String,
    },
}

/// A service's own settings (the replica's are `job submit`'s).
#[derive(Args)]
struct ServiceFlags {
    /// A service file: the API's ServiceRequest as JSON; flags override its fields.
    #[arg(long = "service-file", value_name = "FILE")]
    service_file: Option<PathBuf>,
    /// The port a container replica listens on (a process gets a free one in $PORT).
    #[arg(long)]
    port: Option<u16>,
    /// The HTTP path that answers 2xx when a replica is ready (default /).
    #[arg(long = "health-path", value_name = "PATH")]
    health_path: Option<String>,
    #[arg(long = "min-replicas", value_name = "N")]
    min_replicas: Option<u32>,
    #[arg(long = "max-replicas", value_name = "N")]
    max_replicas: Option<u32>,
    /// Replicas above --min-replicas run on this tier (bronze: burst on the cheapest capacity).
    #[arg(long = "burst-tier", value_name = "TIER")]
    burst_tier: Option<String>,
    /// Scale up when requests in flight per ready replica pass this.
    #[arg(long = "target-in-flight", value_name = "N")]
    target_in_flight: Option<u32>,
    /// Scale up when the p95 latency passes this many milliseconds.
    #[arg(long = "target-p95-ms", value_name = "MS")]
    target_p95_ms: Option<u32>,
    #[arg(long = "scale-up-after", value_name = "SECONDS")]
    scale_up_after_s: Option<u32>,
    #[arg(long = "scale-down-after", value_name = "SECONDS")]
    scale_down_after_s: Option<u32>,
    /// A replica not healthy this long after its placement is ended and replaced.
    #[arg(long = "health-timeout", value_name = "SECONDS")]
    health_timeout_s: Option<u32>,
    /// How long a request to a service with no ready replica waits for one.
    #[arg(long = "wake-timeout", value_name = "SECONDS")]
    wake_timeout_s: Option<u32>,
}

impl ServiceFlags {
    /// The service's fields: `base` (the service file's, or the service as it is), then the
    /// flags over them.
    fn over(&self, base: Map<String, Value>) -> anyhow::Result<Map<String, Value>> {
        let mut body = match &self.service_file {
            Some(path) => {
                let text = std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
                match serde_json::from_str(&text).with_context(|| format!("{} is not JSON", path.display()))? {
                    Value::Object(map) => map,
                    _ => bail!("{} is not a JSON object (the API's ServiceRequest)", path.display()),
                }
            }
            None => base,
        };
        let mut set = |key: &str, value: Option<Value>| {
            if let Some(value) = value {
                body.insert(key.to_string(), value);
            }
        };
        set("port", self.port.map(|port| json!(port)));
        set("health_path", self.health_path.as_ref().map(|path| json!(path)));
        set("min_replicas", self.min_replicas.map(|count| json!(count)));
        set("max_replicas", self.max_replicas.map(|count| json!(count)));
        set("burst_tier", self.burst_tier.as_ref().map(|tier| json!(tier)));
        set("target_in_flight", self.target_in_flight.map(|count| json!(count)));
        set("target_p95_ms", self.target_p95_ms.map(|ms| json!(ms)));
        set("scale_up_after_s", self.scale_up_after_s.map(|s| json!(s)));
        set("scale_down_after_s", self.scale_down_after_s.map(|s| json!(s)));
        set("health_timeout_s", self.health_timeout_s.map(|s| json!(s)));
        set("wake_timeout_s", self.wake_timeout_s.map(|s| json!(s)));
        Ok(body)
    }
}

pub fn run(args: ServiceArgs) -> anyhow::Result<()> {
    if let ServiceCommand::Deploy {
        spec,
        service,
        dry_run: true,
    } = &args.command
    {
        output::print_json(&deploy_request(spec, service)?);
        return Ok(());
    }
    let client = Client::connect(&args.connection)?;
    match args.command {
        ServiceCommand::Deploy { spec, service, .. } => {
            let answer = client.post("/v1/services", &deploy_request(&spec, &service)?)?;
            print_service(&client, &answer)
        }
        ServiceCommand::List => list(&client),
        ServiceCommand::Show { name } => show(&client, &name),
        ServiceCommand::Update { spec, service } => update(&client, &spec, &service),
        ServiceCommand::Scale {
            name,
            min_replicas,
            max_replicas,
        } => {
            let body = json!({"min_replicas": min_replicas, "max_replicas": max_replicas});
            let answer = client.post(&format!("{}/scale", path_of(&name)), &body)?;
            print_service(&client, &answer)
        }
        ServiceCommand::Delete { name } => {
            let answer = client.send(Method::DELETE, &path_of(&name), &[], None)?;
            if client.json {
                output::print_json(&answer);
            } else {
                println!("service {name} deleted; its replicas stop and their escrow is released");
            }
            Ok(())
        }
        ServiceCommand::Key { command } => key(&client, command),
        ServiceCommand::Logs { name, follow } => logs(&client, &name, follow),
    }
}

fn key(client: &Client, command: KeyCommand) -> anyhow::Result<()> {
    match command {
        KeyCommand::Create { name } => {
            let answer = client.post(&format!("{}/keys", path_of(&name)), &json!({}))?;
            if client.json {
                output::print_json(&answer);
            } else {
                let key: api::NewKeyResponse = parse(&answer, "key")?;
                println!("{}", key.api_key);
                eprintln!(
                    "key {} calls service {name} (http://…/s/{name}/…) and nothing else; it is shown only now",
                    key.key_id
                );
            }
        }
        KeyCommand::Revoke { name, key_id } => {
            client.send(
                Method::DELETE,
                &format!("{}/keys/{}", path_of(&name), super::admin::path_segment(&key_id)),
                &[],
                None,
            )?;
            if !client.json {
                println!("key {key_id} of service {name} revoked");
            }
        }
    }
    Ok(())
}

fn path_of(name: &str) -> String {
    format!("/v1/services/{}", super::admin::path_segment(name))
}

/// The replica's job: `base` (the job file's, or the replica as it is) with the flags over it,
/// without a name of its own when `--name` names the service, and one replica per job.
fn replica(spec: &SpecArgs, base: Map<String, Value>) -> anyhow::Result<Map<String, Value>> {
    let mut job = spec.over(base, false)?;
    if spec.name().is_some() {
        job.remove("name");
    }
    job.remove("replicas");
    Ok(job)
}

/// The service file's replica and the service's own fields, when a file is given.
fn read_file(spec: &SpecArgs) -> anyhow::Result<Option<JobFile>> {
    spec.read_file(Purpose::Service)
}

/// The ServiceRequest `service deploy` sends.
fn deploy_request(spec: &SpecArgs, service: &ServiceFlags) -> anyhow::Result<Value> {
    let file = read_file(spec)?;
    let (file_replica, file_service) = file.map_or((None, Map::new()), |file| {
        (Some(file.job), file.service.unwrap_or_default())
    });
    let mut body = service.over(file_service)?;
    match spec.name() {
        Some(name) => {
            body.insert("name".to_string(), json!(name));
        }
        None if body.contains_key("name") => {}
        None => bail!("give the service's name: --name NAME (letters, digits and '-'), or `name` in the service file"),
    }
    let from_service_file = match body.remove("replica") {
        Some(Value::Object(replica)) => replica,
        _ => Map::new(),
    };
    let base = file_replica.unwrap_or(from_service_file);
    body.insert("replica".to_string(), Value::Object(replica(spec, base)?));
    Ok(Value::Object(body))
}

fn update(client: &Client, spec: &SpecArgs, service: &ServiceFlags) -> anyhow::Result<()> {
    let file = read_file(spec)?;
    let file_name = file
        .as_ref()
        .and_then(|file| file.service.as_ref()?.get("name"))
        .and_then(Value::as_str)
        .map(str::to_string);
    let Some(name) = spec.name().map(str::to_string).or(file_name) else {
        bail!("give the service's name: --name NAME, or `name` in the service file");
    };
    let current: ServiceView = parse(&client.get(&path_of(&name), &[])?, "service")?;
    let Some(deployed) = current.deployed else {
        bail!("{name:?} is served by jobs alone, not a deployed service: `fallow service deploy` one");
    };
    let Value::Object(mut base) = serde_json::to_value(&deployed.request)? else {
        bail!("the service's spec is not an object");
    };
    let Some(Value::Object(old_replica)) = base.remove("replica") else {
        bail!("the service's spec has no replica");
    };
    // A service file gives a whole new replica and the settings it names.
    let replica_base = match file {
        Some(file) => {
            base.extend(file.service.unwrap_or_default());
            file.job
        }
        None => old_replica,
    };
    let mut body = service.over(base)?;
    body.insert("name".to_string(), json!(name));
    body.insert("replica".to_string(), Value::Object(replica(spec, replica_base)?));
    let answer = client.put(&path_of(&name), &Value::Object(body))?;
    print_service(client, &answer)
}

fn list(client: &Client) -> anyhow::Result<()> {
    let answer = client.get("/v1/services", &[])?;
    if client.json {
        output::print_json(&answer);
        return Ok(());
    }
    let list: ServiceList = parse(&answer, "services")?;
    if list.services.is_empty() {
        println!("no services: `fallow service deploy --name NAME …` deploys one");
        return Ok(());
    }
    use output::Align::{Left, Right};
    let mut table = output::Table::new(&[
        ("NAME", Left),
        ("VERSION", Right),
        ("READY", Right),
        ("WANTED", Right),
        ("REQ/S", Right),
        ("P95", Right),
        ("TOKENS", Right),
        ("STATUS", Left),
    ]);
    for service in &list.services {
        let deployed = service.deployed.as_ref();
        table.row(vec![
            service.name.clone(),
            deployed.map_or("-".into(), |d| d.version.to_string()),
            service.replicas.len().to_string(),
            deployed.map_or("-".into(), |d| d.desired_replicas.to_string()),
            format!("{:.1}", service.requests_per_sec),
            service.p95_ms.map_or("-".into(), |ms| format!("{ms:.1} ms")),
            service.tokens.to_string(),
            deployed.map_or(String::new(), |d| d.status.clone()),
        ]);
    }
    table.print();
    Ok(())
}

fn show(client: &Client, name: &str) -> anyhow::Result<()> {
    let answer = client.get(&path_of(name), &[])?;
    print_service(client, &answer)
}

fn print_service(client: &Client, answer: &Value) -> anyhow::Result<()> {
    if client.json {
        output::print_json(answer);
        return Ok(());
    }
    let service: ServiceView = parse(answer, "service")?;
    let ms = |value: Option<f64>| value.map_or_else(|| "-".to_string(), |ms| format!("{ms:.1} ms"));
    let mut pairs = vec![("service", service.name.clone())];
    if let Some(deployed) = &service.deployed {
        let version = if deployed.stable_version == deployed.version {
            deployed.version.to_string()
        } else {
            format!("{} (rolling out; {} stable)", deployed.version, deployed.stable_version)
        };
        pairs.push(("version", version));
        pairs.push((
            "scale",
            format!(
                "{} wanted, {}–{}",
                deployed.desired_replicas, deployed.min_replicas, deployed.max_replicas
            ),
        ));
        if !deployed.status.is_empty() {
            pairs.push(("status", deployed.status.clone()));
        }
    }
    let states: Vec<String> = service
        .replica_states
        .iter()
        .map(|replica| {
            format!(
                "job {} v{} {} {}{}",
                replica.job_id,
                replica.version,
                replica.tier,
                replica.state,
                replica.node_id.map_or(String::new(), |node| format!(" on node {node}"))
            )
        })
        .collect();
    pairs.push((
        "replicas",
        format!(
            "{} ready, {} reachable{}",
            service.replicas.len(),
            service.replicas_ready,
            if states.is_empty() {
                String::new()
            } else {
                format!("\n  {}", states.join("\n  "))
            }
        ),
    ));
    pairs.push((
        "requests",
        format!(
            "{} ({} errors), {:.1}/s over the last minute",
            service.requests, service.errors, service.requests_per_sec
        ),
    ));
    pairs.push((
        "latency",
        format!(
            "p50 {}, p95 {}, p99 {}",
            ms(service.p50_ms),
            ms(service.p95_ms),
            ms(service.p99_ms)
        ),
    ));
    pairs.push((
        "tokens",
        format!(
            "{} ({} prompt, {} completion)",
            service.tokens, service.prompt_tokens, service.completion_tokens
        ),
    ));
    pairs.push((
        "cost",
        format!(
            "{} so far{}",
            output::dollars(service.cost_micros),
            service
                .cost_per_million_tokens_micros
                .map_or(String::new(), |per| format!(", {} per 1M tokens", output::dollars(per)))
        ),
    ));
    output::print_fields(&pairs);
    Ok(())
}

fn logs(client: &Client, name: &str, follow: bool) -> anyhow::Result<()> {
    let path = format!("{}/logs", path_of(name));
    let mut after = 0i64;
    let mut stdout = std::io::stdout();
    loop {
        let answer = client.get(&path, &[("after", after.to_string())])?;
        if client.json && !follow {
            output::print_json(&answer);
            return Ok(());
        }
        let page: ServiceLogs = parse(&answer, "logs")?;
        let got = page.chunks.len();
        after = page.next_after;
        for chunk in &page.chunks {
            if client.json {
                writeln!(stdout, "{}", serde_json::to_string(chunk)?)?;
                continue;
            }
            for line in chunk.text.lines() {
                writeln!(stdout, "[{}] {line}", chunk.replica)?;
            }
        }
        stdout.flush()?;
        if got as i64 == api::PAGE_SIZE_MAX {
            continue;
        }
        if !follow {
            return Ok(());
        }
        client.sleep(Duration::from_secs(1));
    }
}
