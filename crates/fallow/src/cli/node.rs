//! `fallow node`: a provider's nodes, their policy (asks per tier, peak and off-peak prices,
//! allowed tiers and classes, thermal and power limits), their calendar of availability
//! windows, and their canaries (known-answer benchmarks, ordered at random or on demand with
//! `verify`), and its owner's reclaims (GPUs taken back from the market for a while, and given
//! back with `resume`). Policy changes read the node's policy, change what the flags say, and
//! write it back whole (`PUT /v1/nodes/{id}/policy`).

use anyhow::{Context, bail};
use api::{CanaryView, NodeView, PolicyDoc, PriceRuleDoc, ReclaimRequest, ReclaimView, ReclaimedLease, WindowDoc};
use clap::{ArgGroup, Args, Subcommand};
use reqwest::Method;
use serde_json::Value;

use super::output::{self, Align, Table, days_from_civil, dollars, utc, utc_or_dash};
use super::{Client, Connection, parse};

const DAY_NAMES: [&str; 7] = ["mon", "tue", "wed", "thu", "fri", "sat", "sun"];

#[derive(Args)]
pub struct NodeArgs {
    #[command(flatten)]
    connection: Connection,
    #[command(subcommand)]
    command: NodeCommand,
}

#[derive(Subcommand)]
enum NodeCommand {
    /// Your nodes (every node, with an admin's key).
    List,
    /// One node: hardware, liveness, telemetry and policy.
    Show {
        /// The node's id.
        id: i64,
    },
    /// A node's selling policy.
    #[command(subcommand)]
    Policy(PolicyCommand),
    /// A node's availability windows: when it sells (none: always).
    #[command(subcommand)]
    Calendar(CalendarCommand),
    /// A node's canaries, newest first: the known-answer benchmarks the coordinator ordered on
    /// it, what it found and the rate against the claimed GPU model's (docs/trust-policy.md § 3).
    Canaries {
        /// The node's id.
        id: i64,
    },
    /// Order a canary on a node now (re-verification: a node cordoned for fraud leaves the
    /// cordon when one passes on its current hardware). The node must be online with an idle GPU.
    Verify {
        /// The node's id.
        id: i64,
    },
    /// Take GPUs of a node back from the market: they take no new work, bronze work on them
    /// stops after its grace period, and firm work (gold, silver) runs on to its end unless
    /// --force (docs/trust-policy.md § 8). Idle GPUs are taken first, then bronze, then firm.
    Reclaim(ReclaimArgs),
    /// Give every reclaimed GPU of a node back to the market.
    Resume {
        /// The node's id.
        id: i64,
    },
}

#[derive(Args)]
struct ReclaimArgs {
    /// The node's id.
    id: i64,
    #[command(flatten)]
    reclaim: ReclaimFlags,
}

/// What to reclaim and for how long; shared with `fallow agent reclaim`.
#[derive(Args, Clone, Debug)]
pub(crate) struct ReclaimFlags {
    /// How many GPUs (default: all of them).
    #[arg(long, value_name = "N", value_parser = parse_reclaim_gpus)]
    pub gpus: Option<u32>,
    /// For how long, e.g. 90s, 30m, 2h, 1d or 1h30m (default: until resumed).
    #[arg(long = "for", value_name = "DURATION", value_parser = parse_reclaim_for_s)]
    pub for_s: Option<u64>,
    /// Stop firm work (gold, silver) on the GPUs too; each such lease's tenant is paid one hour
    /// of it at its price from your earnings.
    #[arg(long)]
    pub force: bool,
}

impl ReclaimFlags {
    pub(crate) fn request(&self) -> ReclaimRequest {
        ReclaimRequest {
            gpus: self.gpus,
            for_s: self.for_s,
            force: self.force,
        }
    }
}

#[derive(Subcommand)]
enum PolicyCommand {
    /// Change a node's policy; what no flag names stays as it is.
    Set(PolicySetArgs),
}

#[derive(Args)]
#[command(group(ArgGroup::new("change").multiple(true).required(true).args([
    "asks", "peak", "off_peak", "no_price_rules", "allow_tiers", "allow_classes", "thermal_limit_c", "power_limit_w",
])))]
struct PolicySetArgs {
    /// The node's id.
    id: i64,
    /// The ask per GPU-hour for a tier, TIER=DOLLARS (e.g. silver=2.10), or TIER=off to stop
    /// selling it; repeat for more tiers.
    #[arg(long = "ask", value_name = "TIER=DOLLARS", value_parser = parse_ask)]
    asks: Vec<(String, Option<String>)>,
    /// Peak hours priced up: 'DAYS HH:MM-HH:MM xMULTIPLIER' (e.g. 'mon-fri 09:00-18:00 x1.3';
    /// days may be omitted for every day). Peak and off-peak rules given together replace the
    /// node's rules; the first that matches a time applies.
    #[arg(long, value_name = "SCHEDULE", value_parser = parse_peak)]
    peak: Vec<PriceRuleDoc>,
    /// Off-peak hours priced down: 'DAYS HH:MM-HH:MM xMULTIPLIER' (e.g. 'sat,sun 00:00-24:00 x0.7').
    #[arg(long, value_name = "SCHEDULE", value_parser = parse_off_peak)]
    off_peak: Vec<PriceRuleDoc>,
    /// Remove every peak and off-peak rule.
    #[arg(long, conflicts_with_all = ["peak", "off_peak"])]
    no_price_rules: bool,
    /// Tiers sold, e.g. silver,bronze (`all`: every tier with an ask).
    #[arg(long, value_name = "TIERS", value_parser = parse_tiers)]
    allow_tiers: Option<Names>,
    /// Workload classes taken, e.g. training,batch (`all`: every class).
    #[arg(long, value_name = "CLASSES", value_parser = parse_classes)]
    allow_classes: Option<Names>,
    /// GPU temperature over which the node takes no new work, °C (`none`: no limit).
    #[arg(long, value_name = "CELSIUS", value_parser = parse_limit::<u16>)]
    thermal_limit_c: Option<Limit<u16>>,
    /// GPU power over which the node takes no new work, W (`none`: no limit).
    #[arg(long, value_name = "WATTS", value_parser = parse_limit::<u32>)]
    power_limit_w: Option<Limit<u32>>,
}

#[derive(Subcommand)]
enum CalendarCommand {
    /// Add a window: weekly (`--weekly 'sat,sun 00:00-24:00'`) or once (`--from … --until …`).
    /// A node with windows sells only inside them.
    Add(CalendarAddArgs),
    /// A node's windows, numbered, and the windows booked ahead on it (reservations).
    List {
        /// The node's id.
        id: i64,
    },
    /// Remove a window by its number in `fallow node calendar list`.
    Remove {
        /// The node's id.
        id: i64,
        /// The window's number.
        number: usize,
    },
}

#[derive(Args)]
#[command(group(ArgGroup::new("window").required(true).args(["weekly", "from"])))]
struct CalendarAddArgs {
    /// The node's id.
    id: i64,
    /// Every week: 'DAYS HH:MM-HH:MM' in UTC (e.g. 'mon-fri 18:00-24:00'; days may be omitted
    /// for every day).
    #[arg(long, value_name = "SCHEDULE", value_parser = parse_weekly)]
    weekly: Option<WindowDoc>,
    /// Once, from this time (RFC 3339, e.g. 2026-12-24T18:00:00Z).
    #[arg(long, value_name = "TIME", requires = "until", value_parser = parse_time_us)]
    from: Option<i64>,
    /// Once, until this time (RFC 3339).
    #[arg(long, value_name = "TIME", requires = "from", value_parser = parse_time_us)]
    until: Option<i64>,
}

pub fn run(args: NodeArgs) -> anyhow::Result<()> {
    let client = Client::connect(&args.connection)?;
    match args.command {
        NodeCommand::List => list(&client),
        NodeCommand::Show { id } => show(&client, id),
        NodeCommand::Policy(PolicyCommand::Set(set)) => policy_set(&client, &set),
        NodeCommand::Calendar(CalendarCommand::Add(add)) => calendar_add(&client, &add),
        NodeCommand::Calendar(CalendarCommand::List { id }) => calendar_list(&client, id),
        NodeCommand::Calendar(CalendarCommand::Remove { id, number }) => calendar_remove(&client, id, number),
        NodeCommand::Canaries { id } => canaries(&client, id),
        NodeCommand::Verify { id } => verify(&client, id),
        NodeCommand::Reclaim(args) => reclaim(&client, &args),
        NodeCommand::Resume { id } => resume(&client, id),
    }
}

fn list(client: &Client) -> anyhow::Result<()> {
    let answer = client.get("/v1/nodes", &[])?;
    if client.json {
        output::print_json(&answer);
        return Ok(());
    }
    let nodes: Vec<NodeView> = parse(&answer, "node list")?;
    if nodes.is_empty() {
        println!("no nodes yet: start `fallow agent` on a GPU host with your provider key to register one");
        return Ok(());
    }
    let mut table = Table::new(&[
        ("ID", Align::Right),
        ("NAME", Align::Left),
        ("GPU", Align::Left),
        ("GPUS", Align::Right),
        ("REGION", Align::Left),
        ("SITE", Align::Left),
        ("ONLINE", Align::Left),
        ("LEASES", Align::Right),
        ("RELIABILITY", Align::Right),
        ("ASKS", Align::Left),
        ("LAST HEARTBEAT", Align::Left),
    ]);
    for node in &nodes {
        table.row(vec![
            node.id.to_string(),
            node.name.clone(),
            if node.simulated {
                format!("{} (simulated)", node.gpu_model)
            } else {
                node.gpu_model.clone()
            },
            node.gpu_count.to_string(),
            node.region.clone(),
            node.site.clone(),
            online_text(node),
            node.live_leases.to_string(),
            format!("{:.3}", node.reliability),
            asks_text(&node.policy),
            utc_or_dash(node.last_heartbeat_at_us),
        ]);
    }
    table.print();
    Ok(())
}

fn online_text(node: &NodeView) -> String {
    match (node.online, node.over_limit_since_us) {
        (true, Some(_)) => "over limit".to_string(),
        (true, None) => "yes".to_string(),
        (false, _) => "no".to_string(),
    }
}

fn fetch(client: &Client, id: i64) -> anyhow::Result<(Value, NodeView)> {
    let answer = client.get(&format!("/v1/nodes/{id}"), &[])?;
    let node = parse(&answer, "node")?;
    Ok((answer, node))
}

fn show(client: &Client, id: i64) -> anyhow::Result<()> {
    let (answer, node) = fetch(client, id)?;
    if client.json {
        output::print_json(&answer);
        return Ok(());
    }
    let mut pairs = vec![
        ("id", node.id.to_string()),
        ("name", node.name.clone()),
        ("provider", node.provider_id.to_string()),
        (
            "GPUs",
            format!(
                "{} × {}{}",
                node.gpu_count,
                node.gpu_model,
                if node.simulated { " (simulated)" } else { "" }
            ),
        ),
        (
            "CPU, memory",
            format!("{} cores, {} GiB", node.cpu_milli / 1000, node.memory_mib / 1024),
        ),
        (
            "topology",
            format!(
                "{} / {} / {} / {}",
                node.region, node.site, node.fabric, node.nvlink_domain
            ),
        ),
        ("NVLink domain", nvlink_text(&node)),
        ("location", location_text(&node)),
        (
            "gang traffic",
            format!("{} ports {}", or_dash(&node.advertise_addr), or_dash(&node.gang_ports)),
        ),
        ("online", online_text(&node)),
    ];
    if !node.reclaimed_gpus.is_empty() {
        pairs.push((
            "reclaimed",
            format!(
                "{} {}; `fallow node resume {}` gives them back",
                gpus_text(&node.reclaimed_gpus),
                until_text(node.reclaimed_until_us, output::now_us()),
                node.id
            ),
        ));
    }
    pairs.extend([
        ("last heartbeat", utc_or_dash(node.last_heartbeat_at_us)),
        ("live leases", node.live_leases.to_string()),
        ("reliability", format!("{:.3}", node.reliability)),
    ]);
    if let Some(reputation) = &node.reputation {
        let inputs: Vec<String> = reputation
            .inputs
            .iter()
            .filter(|(_, weight)| **weight > 0.0)
            .map(|(name, weight)| format!("{} {weight:.1}", name.replace('_', " ")))
            .collect();
        pairs.push((
            "reputation",
            format!(
                "{:.3} (lower bound {:.3}; {}; docs/trust-policy.md § 1)",
                reputation.score,
                reputation.lower_bound,
                if inputs.is_empty() {
                    "no outcomes yet: the prior".to_string()
                } else {
                    inputs.join(", ")
                }
            ),
        ));
    }
    if let Some(since) = node.over_limit_since_us {
        pairs.push(("over limit since", utc(since)));
    }
    if let Some(changed) = node.fingerprint_changed_at_us {
        pairs.push(("fingerprint changed", utc(changed)));
    }
    pairs.extend(policy_fields(&node.policy, node.id));
    output::print_fields(&pairs);
    Ok(())
}

fn or_dash(text: &str) -> &str {
    if text.is_empty() { "-" } else { text }
}

/// The NVLink domain, where it came from, and what NVML reported.
fn nvlink_text(node: &NodeView) -> String {
    let source = match node.nvlink_source.as_str() {
        "flag" => "declared (--nvlink-domain)",
        "nvml-fabric" => "NVML fabric (multi-node NVLink)",
        "nvswitch" => "NVML: NVSwitch inside the node",
        "node" => "the node alone (nothing declared or detected)",
        _ => "not reported",
    };
    let detected = if node.nvlink_detected.is_empty() {
        "NVML reported nothing".to_string()
    } else {
        format!("NVML: {}", node.nvlink_detected)
    };
    format!("{} ({source}; {detected})", or_dash(&node.nvlink_domain))
}

/// The coordinates and where they came from.
fn location_text(node: &NodeView) -> String {
    let source = match node.location_source.as_str() {
        "flag" => "declared (--latitude/--longitude)",
        "site" => "the site's (fallow admin site set)",
        _ => "none declared, the site has none",
    };
    format!("{:.4}, {:.4} ({source})", node.latitude, node.longitude)
}

fn policy_fields(policy: &PolicyDoc, id: i64) -> Vec<(&'static str, String)> {
    let rules: Vec<String> = policy.price_rules.iter().map(rule_text).collect();
    let limit = |value: Option<String>| value.unwrap_or_else(|| "none".to_string());
    vec![
        ("asks", format!("{} per GPU-hour", asks_text(policy))),
        (
            "price rules",
            if rules.is_empty() {
                "none".to_string()
            } else {
                rules.join("; ")
            },
        ),
        (
            "windows",
            if policy.windows.is_empty() {
                "none: sells at all times".to_string()
            } else {
                format!(
                    "{} (fallow node calendar list {id}); sells only inside them",
                    policy.windows.len()
                )
            },
        ),
        (
            "allowed tiers",
            if policy.allowed_tiers.is_empty() {
                "those with an ask".to_string()
            } else {
                policy.allowed_tiers.join(", ")
            },
        ),
        (
            "allowed classes",
            if policy.allowed_classes.is_empty() {
                "all".to_string()
            } else {
                policy.allowed_classes.join(", ")
            },
        ),
        (
            "thermal limit",
            limit(policy.thermal_limit_c.map(|c| format!("{c} °C"))),
        ),
        ("power limit", limit(policy.power_limit_w.map(|w| format!("{w} W")))),
    ]
}

/// `silver $2.10, bronze $0.90`, gold first.
fn asks_text(policy: &PolicyDoc) -> String {
    let asks: Vec<String> = ["gold", "silver", "bronze"]
        .iter()
        .filter_map(|tier| {
            policy.asks.get(*tier).map(|ask| {
                let price = model::Micros::parse_dollars(ask).map_or_else(|| ask.clone(), |micros| dollars(micros.0));
                format!("{tier} {price}")
            })
        })
        .collect();
    asks.join(", ")
}

fn rule_text(rule: &PriceRuleDoc) -> String {
    format!(
        "{} {}–{} ×{}",
        days_text(&rule.days),
        clock(rule.start_minute),
        clock(rule.end_minute),
        permille_text(rule.multiplier_permille)
    )
}

fn policy_set(client: &Client, args: &PolicySetArgs) -> anyhow::Result<()> {
    let (_, node) = fetch(client, args.id)?;
    let mut policy = node.policy;
    for (tier, ask) in &args.asks {
        match ask {
            Some(ask) => policy.asks.insert(tier.clone(), ask.clone()),
            None => policy.asks.remove(tier),
        };
    }
    if policy.asks.is_empty() {
        bail!("a node sells at least one tier: keep an ask (e.g. --ask silver=2.10)");
    }
    if !args.peak.is_empty() || !args.off_peak.is_empty() {
        policy.price_rules = args.peak.iter().chain(&args.off_peak).cloned().collect();
    }
    if args.no_price_rules {
        policy.price_rules.clear();
    }
    if let Some(tiers) = &args.allow_tiers {
        policy.allowed_tiers = tiers.0.clone();
    }
    if let Some(classes) = &args.allow_classes {
        policy.allowed_classes = classes.0.clone();
    }
    if let Some(limit) = args.thermal_limit_c {
        policy.thermal_limit_c = limit.0;
    }
    if let Some(limit) = args.power_limit_w {
        policy.power_limit_w = limit.0;
    }
    let node = put_policy(client, args.id, &policy)?;
    if !client.json {
        println!("node {} policy updated", node.id);
        output::print_fields(&policy_fields(&node.policy, node.id));
    }
    Ok(())
}

/// Writes a node's whole policy; prints the answer for `--json`.
fn put_policy(client: &Client, id: i64, policy: &PolicyDoc) -> anyhow::Result<NodeView> {
    let body = serde_json::to_value(policy).context("encoding the policy")?;
    let answer = client.put(&format!("/v1/nodes/{id}/policy"), &body)?;
    if client.json {
        output::print_json(&answer);
    }
    parse(&answer, "node")
}

fn calendar_add(client: &Client, args: &CalendarAddArgs) -> anyhow::Result<()> {
    let window = match (&args.weekly, args.from, args.until) {
        (Some(weekly), _, _) => weekly.clone(),
        (None, Some(from), Some(until)) => {
            if from >= until {
                bail!("--from must be before --until");
            }
            WindowDoc {
                days: Vec::new(),
                start_minute: None,
                end_minute: None,
                start_us: Some(from),
                end_us: Some(until),
            }
        }
        _ => bail!("give --weekly 'DAYS HH:MM-HH:MM', or --from TIME and --until TIME"),
    };
    let (_, node) = fetch(client, args.id)?;
    let mut policy = node.policy;
    let first = policy.windows.is_empty();
    policy.windows.push(window.clone());
    let node = put_policy(client, args.id, &policy)?;
    if !client.json {
        println!(
            "node {}: window {} added: {}",
            node.id,
            node.policy.windows.len(),
            window_summary(&window)
        );
        if first {
            println!("the node now sells only inside its windows");
        }
    }
    Ok(())
}

fn calendar_list(client: &Client, id: i64) -> anyhow::Result<()> {
    let (answer, node) = fetch(client, id)?;
    let booked = client.get(&format!("/v1/nodes/{id}/calendar"), &[])?;
    if client.json {
        output::print_json(&serde_json::json!({
            "node_id": id,
            "windows": answer["policy"]["windows"],
            "booked": booked["entries"],
        }));
        return Ok(());
    }
    if node.policy.windows.is_empty() {
        println!("node {id} has no windows: it sells at all times");
    } else {
        let mut table = Table::new(&[
            ("#", Align::Right),
            ("KIND", Align::Left),
            ("DAYS", Align::Left),
            ("FROM", Align::Left),
            ("UNTIL", Align::Left),
        ]);
        for (index, window) in node.policy.windows.iter().enumerate() {
            let mut row = vec![(index + 1).to_string()];
            row.extend(window_text(window));
            table.row(row);
        }
        table.print();
        println!("times in UTC; the node sells only inside these windows");
    }
    let booked: api::CalendarView = parse(&booked, "node calendar")?;
    if booked.entries.is_empty() {
        println!("nothing booked ahead on node {id}");
        return Ok(());
    }
    println!("booked ahead (reservations hold these GPUs; bronze may use them until a grace period before):");
    let mut table = Table::new(&[
        ("RESERVATION", Align::Right),
        ("STATE", Align::Left),
        ("GPUS", Align::Right),
        ("PRICE/GPU-H", Align::Right),
        ("FROM", Align::Left),
        ("UNTIL", Align::Left),
    ]);
    for entry in &booked.entries {
        table.row(vec![
            entry.reservation_id.to_string(),
            entry.state.clone(),
            entry.gpus.to_string(),
            dollars(entry.price_micros_per_gpu_hour),
            utc(entry.from_us),
            utc(entry.until_us),
        ]);
    }
    table.print();
    Ok(())
}

fn calendar_remove(client: &Client, id: i64, number: usize) -> anyhow::Result<()> {
    let (_, node) = fetch(client, id)?;
    let mut policy = node.policy;
    if number == 0 || number > policy.windows.len() {
        bail!(
            "node {id} has {} window(s); `fallow node calendar list {id}` numbers them from 1",
            policy.windows.len()
        );
    }
    let removed = policy.windows.remove(number - 1);
    let node = put_policy(client, id, &policy)?;
    if !client.json {
        println!("node {id}: window {number} removed: {}", window_summary(&removed));
        if node.policy.windows.is_empty() {
            println!("the node has no windows left: it sells at all times");
        }
    }
    Ok(())
}

fn canaries(client: &Client, id: i64) -> anyhow::Result<()> {
    let answer = client.get(&format!("/v1/nodes/{id}/canaries"), &[])?;
    if client.json {
        output::print_json(&answer);
        return Ok(());
    }
    let canaries: Vec<CanaryView> = parse(&answer, "canary list")?;
    print!("{}", super::provider::canaries_text(id, &canaries));
    Ok(())
}

fn verify(client: &Client, id: i64) -> anyhow::Result<()> {
    let answer = client.send(Method::POST, &format!("/v1/nodes/{id}/verify"), &[], None)?;
    if client.json {
        output::print_json(&answer);
        return Ok(());
    }
    let canary: CanaryView = parse(&answer, "canary")?;
    let gpus: Vec<String> = canary.gpus.iter().map(u8::to_string).collect();
    println!(
        "canary {} ordered on node {id} (GPUs {}, held to a {}'s rate): its agent runs it after its next heartbeat",
        canary.id,
        gpus.join(","),
        canary.claimed_model
    );
    println!("`fallow node canaries {id}` shows what it finds");
    Ok(())
}

fn reclaim(client: &Client, args: &ReclaimArgs) -> anyhow::Result<()> {
    let body = serde_json::to_value(args.reclaim.request()).context("encoding the reclaim")?;
    let answer = client.post(&format!("/v1/nodes/{}/reclaim", args.id), &body)?;
    if client.json {
        output::print_json(&answer);
        return Ok(());
    }
    let view: ReclaimView = parse(&answer, "reclaim")?;
    print!(
        "{}",
        reclaim_text(&view, &ReclaimHints::node(args.id), output::now_us())
    );
    Ok(())
}

fn resume(client: &Client, id: i64) -> anyhow::Result<()> {
    let answer = client.send(Method::DELETE, &format!("/v1/nodes/{id}/reclaim"), &[], None)?;
    if client.json {
        output::print_json(&answer);
        return Ok(());
    }
    let view: ReclaimView = parse(&answer, "reclaim")?;
    print!("{}", reclaim_text(&view, &ReclaimHints::node(id), output::now_us()));
    Ok(())
}

/// The commands a reclaim's output suggests: `fallow node …` with the provider's key, or
/// `fallow agent …` on the node's host.
pub(crate) struct ReclaimHints {
    pub resume: String,
    pub force: String,
}

impl ReclaimHints {
    fn node(id: i64) -> ReclaimHints {
        ReclaimHints {
            resume: format!("fallow node resume {id}"),
            force: format!("fallow node reclaim {id} --force"),
        }
    }
}

/// A reclaim in words: the GPUs taken and until when, then the work that stops and the firm
/// work that runs on. `now_us` is for the time left.
pub(crate) fn reclaim_text(view: &ReclaimView, hints: &ReclaimHints, now_us: i64) -> String {
    let node = view.node_id;
    if view.gpus.is_empty() {
        return format!("node {node} resumed: every GPU is on sale again\n");
    }
    let mut text = format!(
        "node {node}: {} reclaimed {}\n",
        gpus_text(&view.gpus),
        match view.until_us {
            Some(_) => until_text(view.until_us, now_us),
            None => format!("until `{}`", hints.resume),
        }
    );
    if view.stopping.is_empty() && view.running_on.is_empty() {
        text.push_str("no work was running on them: they sell nothing from now on\n");
        return text;
    }
    for lease in &view.stopping {
        let killed = match lease.stop_at_us {
            Some(at) => format!("killed at {}{}", utc(at), in_text(at, now_us)),
            None => "stopping".to_string(),
        };
        let credit = if lease.credit_micros > 0 {
            format!("its tenant is paid {} from your earnings", dollars(lease.credit_micros))
        } else if lease.tier == "bronze" {
            "no credit (bronze work)".to_string()
        } else {
            // The coordinator pays a firm lease's credit once, when it first stops it.
            "stopping already: nothing more paid".to_string()
        };
        text.push_str(&format!("stops:    {}; {killed}; {credit}\n", lease_text(lease)));
    }
    for lease in &view.running_on {
        text.push_str(&format!(
            "runs on:  {}; expected to end at {}{}\n",
            lease_text(lease),
            utc(lease.expected_end_us),
            in_text(lease.expected_end_us, now_us)
        ));
    }
    if !view.running_on.is_empty() {
        text.push_str(&format!(
            "  → firm work keeps its GPUs until it ends; `{}` stops it now and pays each tenant one \
             hour of its lease at its price from your earnings (docs/trust-policy.md § 8)\n",
            hints.force
        ));
    }
    text
}

/// `silver job 7 (lease 12, GPUs 0,1)`.
fn lease_text(lease: &ReclaimedLease) -> String {
    format!(
        "{} job {} (lease {}, {})",
        lease.tier,
        lease.job_id,
        lease.lease_id,
        gpus_text(&lease.gpus)
    )
}

/// `GPU 1`, `GPUs 0,1`.
fn gpus_text(gpus: &[u8]) -> String {
    let list: Vec<String> = gpus.iter().map(u8::to_string).collect();
    format!("GPU{} {}", if gpus.len() == 1 { "" } else { "s" }, list.join(","))
}

/// `until 2026-12-24 18:00:00Z (in 2h00m)`, or `until resumed`.
fn until_text(until_us: Option<i64>, now_us: i64) -> String {
    match until_us {
        Some(at) => format!("until {}{}", utc(at), in_text(at, now_us)),
        None => "until resumed".to_string(),
    }
}

/// ` (in 2h00m)` for a time ahead of `now_us`; nothing for one past.
fn in_text(at_us: i64, now_us: i64) -> String {
    if at_us <= now_us {
        return String::new();
    }
    let left = std::time::Duration::from_micros((at_us - now_us) as u64);
    format!(" (in {})", output::duration(left))
}

/// Kind, days, from and until of a window, for a table row.
fn window_text(window: &WindowDoc) -> [String; 4] {
    match (window.start_minute, window.end_minute, window.start_us, window.end_us) {
        (Some(start), Some(end), _, _) => ["weekly".to_string(), days_text(&window.days), clock(start), clock(end)],
        (_, _, Some(start), Some(end)) => ["once".to_string(), "-".to_string(), utc(start), utc(end)],
        _ => ["?".to_string(), "-".to_string(), "-".to_string(), "-".to_string()],
    }
}

/// A window in words: `every mon–fri 18:00–24:00 UTC`, `from … until …`.
fn window_summary(window: &WindowDoc) -> String {
    let [kind, days, from, until] = window_text(window);
    if kind == "weekly" {
        format!("every {days}, {from}–{until} UTC")
    } else {
        format!("from {from} until {until}")
    }
}

fn clock(minute: u32) -> String {
    format!("{:02}:{:02}", minute / 60, minute % 60)
}

fn permille_text(permille: u32) -> String {
    let text = format!("{}.{:03}", permille / 1000, permille % 1000);
    text.trim_end_matches('0').trim_end_matches('.').to_string()
}

/// `mon–fri`, `sat,sun`, `every day`.
fn days_text(days: &[u8]) -> String {
    let mut days: Vec<u8> = days.iter().copied().filter(|day| *day < 7).collect();
    days.sort_unstable();
    days.dedup();
    if days.is_empty() || days.len() == 7 {
        return "every day".to_string();
    }
    let mut parts = Vec::new();
    let mut start = 0;
    while start < days.len() {
        let mut end = start;
        while end + 1 < days.len() && days[end + 1] == days[end] + 1 {
            end += 1;
        }
        let (first, last) = (DAY_NAMES[days[start] as usize], DAY_NAMES[days[end] as usize]);
        parts.push(match end - start {
            0 => first.to_string(),
            1 => format!("{first},{last}"),
            _ => format!("{first}–{last}"),
        });
        start = end + 1;
    }
    parts.join(",")
}

// ---------------------------------------------------------------- flag parsers

fn parse_ask(text: &str) -> Result<(String, Option<String>), String> {
    let (tier, price) = text
        .split_once('=')
        .ok_or_else(|| format!("{text:?} is not TIER=DOLLARS (e.g. silver=2.10) or TIER=off"))?;
    let tier = tier.trim().to_ascii_lowercase();
    if !["gold", "silver", "bronze"].contains(&tier.as_str()) {
        return Err(format!("{tier:?} is not a tier: use gold, silver or bronze"));
    }
    let price = price.trim();
    if price == "off" || price == "none" {
        return Ok((tier, None));
    }
    match model::Micros::parse_dollars(price) {
        Some(micros) if micros.0 > 0 && micros.0 <= api::PRICE_MICROS_MAX => {
            Ok((tier, Some(price.trim_start_matches('$').to_string())))
        }
        _ => Err(format!(
            "{price:?} is not a price in dollars between 0.000001 and 1000 (e.g. 2.10)"
        )),
    }
}

/// `mon-fri`, `sat,sun`, `mon,wed-fri`, `daily`: days numbered 0 (Monday) … 6; none = every day.
fn parse_days(text: &str) -> Result<Vec<u8>, String> {
    let text = text.trim().to_ascii_lowercase();
    if matches!(text.as_str(), "daily" | "all" | "every" | "*") {
        return Ok(Vec::new());
    }
    let day = |name: &str| {
        let name = name.trim();
        DAY_NAMES
            .iter()
            .position(|day| name.len() >= 3 && day.starts_with(&name[..3]))
            .map(|index| index as u8)
            .ok_or_else(|| format!("{name:?} is not a day: use mon, tue, wed, thu, fri, sat, sun"))
    };
    let mut days = Vec::new();
    for part in text.split(',') {
        match part.split_once(['-', '–']) {
            Some((first, last)) => {
                let (first, last) = (day(first)?, day(last)?);
                if first > last {
                    return Err(format!("{part:?}: a range of days runs from Monday to Sunday"));
                }
                days.extend(first..=last);
            }
            None => days.push(day(part)?),
        }
    }
    days.sort_unstable();
    days.dedup();
    if days.len() == 7 {
        days.clear();
    }
    Ok(days)
}

/// `HH:MM-HH:MM` as minutes of the day, the end up to 24:00.
fn parse_minutes(text: &str) -> Result<(u32, u32), String> {
    let minute = |clock: &str| -> Result<u32, String> {
        let (hours, minutes) = clock
            .trim()
            .split_once(':')
            .ok_or_else(|| format!("{clock:?} is not HH:MM"))?;
        match (hours.parse::<u32>(), minutes.parse::<u32>()) {
            (Ok(hours), Ok(minutes)) if minutes < 60 && hours * 60 + minutes <= 1440 => Ok(hours * 60 + minutes),
            _ => Err(format!("{clock:?} is not a time of day HH:MM (00:00–24:00)")),
        }
    };
    let (start, end) = text
        .split_once(['-', '–'])
        .ok_or_else(|| format!("{text:?} is not HH:MM-HH:MM"))?;
    let (start, end) = (minute(start)?, minute(end)?);
    if start >= end {
        return Err(format!(
            "{text:?}: the start is not before the end (a slot over midnight is two slots)"
        ));
    }
    Ok((start, end))
}

/// `[DAYS] HH:MM-HH:MM`: days and minutes.
fn parse_schedule(words: &[&str], text: &str) -> Result<(Vec<u8>, u32, u32), String> {
    let (days, times) = match words {
        [times] => (Vec::new(), *times),
        [days, times] => (parse_days(days)?, *times),
        _ => {
            return Err(format!(
                "{text:?} is not '[DAYS] HH:MM-HH:MM' (e.g. 'mon-fri 09:00-18:00')"
            ));
        }
    };
    let (start, end) = parse_minutes(times)?;
    Ok((days, start, end))
}

fn parse_weekly(text: &str) -> Result<WindowDoc, String> {
    let words: Vec<&str> = text.split_whitespace().collect();
    let (days, start, end) = parse_schedule(&words, text)?;
    Ok(WindowDoc {
        days,
        start_minute: Some(start),
        end_minute: Some(end),
        start_us: None,
        end_us: None,
    })
}

/// `[DAYS] HH:MM-HH:MM xMULTIPLIER`.
fn parse_price_rule(text: &str) -> Result<PriceRuleDoc, String> {
    let words: Vec<&str> = text.split_whitespace().collect();
    let Some((multiplier, schedule)) = words.split_last() else {
        return Err("give '[DAYS] HH:MM-HH:MM xMULTIPLIER', e.g. 'mon-fri 09:00-18:00 x1.3'".to_string());
    };
    let (days, start_minute, end_minute) = parse_schedule(schedule, text)?;
    let number = multiplier.trim_start_matches(['x', '×', '*']);
    let micros = model::Micros::parse_dollars(number)
        .filter(|micros| micros.0 % 1000 == 0)
        .ok_or_else(|| format!("{multiplier:?} is not a multiplier like x1.3 (at most three decimals)"))?;
    let multiplier_permille = u32::try_from(micros.0 / 1000)
        .ok()
        .filter(|permille| (100..=10_000).contains(permille))
        .ok_or_else(|| format!("{multiplier:?}: a multiplier is 0.1–10"))?;
    Ok(PriceRuleDoc {
        days,
        start_minute,
        end_minute,
        multiplier_permille,
    })
}

fn parse_peak(text: &str) -> Result<PriceRuleDoc, String> {
    let rule = parse_price_rule(text)?;
    if rule.multiplier_permille <= 1000 {
        return Err(format!(
            "{text:?}: a peak multiplier is over 1 (x1.3); cheaper hours are --off-peak"
        ));
    }
    Ok(rule)
}

fn parse_off_peak(text: &str) -> Result<PriceRuleDoc, String> {
    let rule = parse_price_rule(text)?;
    if rule.multiplier_permille >= 1000 {
        return Err(format!(
            "{text:?}: an off-peak multiplier is under 1 (x0.7); dearer hours are --peak"
        ));
    }
    Ok(rule)
}

/// A duration like `90s`, `30m`, `2h`, `1d` or `1h30m` (units from the largest down, each at
/// most once), in seconds.
pub(crate) fn parse_duration_s(text: &str) -> Result<u64, String> {
    let shown = text.trim();
    let bad =
        |why: String| format!("{shown:?} {why}: give a number and a unit (s, m, h, d), e.g. 90s, 30m, 2h, 1d or 1h30m");
    if shown.is_empty() {
        return Err(bad("is empty".to_string()));
    }
    let mut total: u64 = 0;
    let mut number: Option<u64> = None;
    let mut previous_unit_s = u64::MAX;
    for character in shown.chars() {
        if let Some(digit) = character.to_digit(10) {
            let grown = number
                .unwrap_or(0)
                .checked_mul(10)
                .and_then(|grown| grown.checked_add(u64::from(digit)))
                .ok_or_else(|| bad("is too long".to_string()))?;
            number = Some(grown);
            continue;
        }
        let unit_s = match character.to_ascii_lowercase() {
            's' => 1,
            'm' => 60,
            'h' => 3600,
            'd' => 86_400,
            other => return Err(bad(format!("has {other:?}, which is not a unit"))),
        };
        let Some(count) = number.take() else {
            return Err(bad(format!("has the unit {character:?} without a number before it")));
        };
        if unit_s >= previous_unit_s {
            return Err(bad(
                "gives its units out of order (largest first, each once)".to_string()
            ));
        }
        previous_unit_s = unit_s;
        total = count
            .checked_mul(unit_s)
            .and_then(|seconds| total.checked_add(seconds))
            .ok_or_else(|| bad("is too long".to_string()))?;
    }
    if number.is_some() {
        return Err(bad("ends in a number without a unit".to_string()));
    }
    Ok(total)
}

/// `--gpus`: at least one (the coordinator checks the node has that many).
fn parse_reclaim_gpus(text: &str) -> Result<u32, String> {
    match text.trim().parse::<u32>() {
        Ok(0) => Err("0 GPUs is nothing to reclaim: give 1 or more, or leave --gpus out for all".to_string()),
        Ok(gpus) => Ok(gpus),
        Err(_) => Err(format!("{text:?} is not a whole number of GPUs")),
    }
}

/// `--for`: a duration from 1 second to a year (`api::RECLAIM_FOR_S_MAX`).
pub(crate) fn parse_reclaim_for_s(text: &str) -> Result<u64, String> {
    match parse_duration_s(text)? {
        0 => Err(format!("{:?} is no time: give at least 1s", text.trim())),
        seconds if seconds > api::RECLAIM_FOR_S_MAX => Err(format!(
            "{:?} is over a year (366d): leave --for out to reclaim until resumed",
            text.trim()
        )),
        seconds => Ok(seconds),
    }
}

/// Names given as a list; empty means no restriction.
#[derive(Clone, Debug)]
struct Names(Vec<String>);

/// A limit, or none.
#[derive(Clone, Copy, Debug)]
struct Limit<T>(Option<T>);

fn parse_tiers(text: &str) -> Result<Names, String> {
    parse_names(text, &["gold", "silver", "bronze"], "tier")
}

fn parse_classes(text: &str) -> Result<Names, String> {
    parse_names(text, &["training", "inference", "batch", "eval"], "class")
}

/// A comma-separated list of known names; `all` is the empty list (the API's "no restriction").
fn parse_names(text: &str, known: &[&str], what: &str) -> Result<Names, String> {
    if text.trim() == "all" {
        return Ok(Names(Vec::new()));
    }
    let mut names = Vec::new();
    for name in text.split(',').map(str::trim) {
        if !known.contains(&name) {
            return Err(format!("{name:?} is not a {what}: use {} or all", known.join(", ")));
        }
        if !names.iter().any(|known: &String| known == name) {
            names.push(name.to_string());
        }
    }
    Ok(Names(names))
}

fn parse_limit<T: std::str::FromStr>(text: &str) -> Result<Limit<T>, String> {
    if text.trim() == "none" {
        return Ok(Limit(None));
    }
    text.trim()
        .parse()
        .map(|limit| Limit(Some(limit)))
        .map_err(|_| format!("{text:?} is not a whole number or `none`"))
}

/// RFC 3339 (`2026-12-24T18:00:00Z`, `2026-12-24T19:00+01:00`; seconds optional) as microseconds
/// since the Unix epoch.
pub(crate) fn parse_time_us(text: &str) -> Result<i64, String> {
    let bad = || format!("{text:?} is not a time like 2026-12-24T18:00:00Z (RFC 3339, with Z or an offset)");
    let text = text.trim();
    if text.len() < 17 || !text.is_char_boundary(10) || !text.is_char_boundary(11) {
        return Err(bad());
    }
    let (date, rest) = (&text[..10], &text[11..]);
    if !matches!(text.as_bytes()[10], b'T' | b't' | b' ') {
        return Err(bad());
    }
    let date: Vec<&str> = date.split('-').collect();
    let [year, month, day] = date[..] else {
        return Err(bad());
    };
    let number = |part: &str| part.parse::<i64>().map_err(|_| bad());
    let (year, month, day) = (number(year)?, number(month)?, number(day)?);
    if !(1970..=9999).contains(&year) || !(1..=12).contains(&month) || !(1..=31).contains(&day) {
        return Err(bad());
    }
    let (clock, offset_s) = if let Some(clock) = rest.strip_suffix(['Z', 'z']) {
        (clock, 0)
    } else {
        let at = rest.rfind(['+', '-']).ok_or_else(bad)?;
        let (clock, offset) = rest.split_at(at);
        let sign = if offset.starts_with('-') { -1 } else { 1 };
        let (hours, minutes) = offset[1..].split_once(':').ok_or_else(bad)?;
        (clock, sign * (number(hours)? * 3600 + number(minutes)? * 60))
    };
    let parts: Vec<&str> = clock.split(':').collect();
    let (hour, minute, second) = match parts[..] {
        [hour, minute] => (number(hour)?, number(minute)?, 0),
        [hour, minute, second] => (
            number(hour)?,
            number(minute)?,
            number(second.split('.').next().unwrap_or(second))?,
        ),
        _ => return Err(bad()),
    };
    if hour > 23 || minute > 59 || second > 60 {
        return Err(bad());
    }
    let seconds = days_from_civil(year, month, day) * 86_400 + hour * 3600 + minute * 60 + second - offset_s;
    Ok(seconds * 1_000_000)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn schedules_parse_into_the_api_shapes() {
        let rule = parse_peak("mon-fri 09:00-18:00 x1.3").unwrap();
        assert_eq!(
            (rule.days, rule.start_minute, rule.end_minute, rule.multiplier_permille),
            (vec![0, 1, 2, 3, 4], 540, 1080, 1300)
        );
        let rule = parse_off_peak("00:00-06:00 0.75").unwrap();
        assert_eq!((rule.days.len(), rule.multiplier_permille), (0, 750));
        let window = parse_weekly("sat,sun 00:00-24:00").unwrap();
        assert_eq!((window.days, window.end_minute), (vec![5, 6], Some(1440)));
        assert_eq!(parse_days("mon,wed-fri").unwrap(), vec![0, 2, 3, 4]);
        assert_eq!(parse_days("mon-sun").unwrap(), Vec::<u8>::new());
        assert_eq!(days_text(&[0, 1, 2, 3, 4]), "mon–fri");
        assert_eq!(days_text(&[0, 2, 3, 5, 6]), "mon,wed,thu,sat,sun");
        assert_eq!(permille_text(1300), "1.3");
        assert_eq!(permille_text(1000), "1");
    }

    #[test]
    fn bad_schedules_say_what_is_wrong() {
        for (result, says) in [
            (parse_peak("mon-fri 09:00-18:00 x0.8").map(|_| ()), "--off-peak"),
            (parse_off_peak("09:00-18:00 x1.2").map(|_| ()), "--peak"),
            (parse_peak("funday 09:00-18:00 x1.2").map(|_| ()), "not a day"),
            (parse_peak("18:00-09:00 x1.2").map(|_| ()), "over midnight"),
            (parse_peak("09:00-25:00 x1.2").map(|_| ()), "00:00–24:00"),
            (parse_peak("09:00-18:00 x20").map(|_| ()), "0.1–10"),
            (parse_weekly("mon fri 09:00-18:00").map(|_| ()), "[DAYS]"),
            (parse_ask("platinum=1").map(|_| ()), "not a tier"),
            (parse_ask("gold=free").map(|_| ()), "not a price"),
            (parse_tiers("gold,tin").map(|_| ()), "not a tier"),
        ] {
            let error = result.unwrap_err();
            assert!(error.contains(says), "{error}");
        }
    }

    #[test]
    fn durations_parse_in_seconds() {
        for (text, seconds) in [
            ("90s", 90),
            ("30m", 1800),
            ("2h", 7200),
            ("1d", 86_400),
            ("1h30m", 5400),
            ("1d2h3m4s", 93_784),
            (" 2H ", 7200),
        ] {
            assert_eq!(parse_duration_s(text), Ok(seconds), "{text}");
        }
        assert_eq!(parse_reclaim_for_s("366d"), Ok(api::RECLAIM_FOR_S_MAX));
    }

    #[test]
    fn bad_durations_say_what_is_wrong_and_the_forms() {
        for (text, says) in [
            ("5x", "not a unit"),
            ("90", "without a unit"),
            ("", "is empty"),
            ("h", "without a number"),
            ("30m1h", "out of order"),
            ("1h1h", "out of order"),
            ("1.5h", "not a unit"),
            ("99999999999999999999s", "too long"),
            ("9999999999999999d", "too long"),
        ] {
            let error = parse_duration_s(text).unwrap_err();
            assert!(error.contains(says) && error.contains("1h30m"), "{text}: {error}");
        }
        assert!(parse_reclaim_for_s("0s").unwrap_err().contains("at least 1s"));
        assert!(parse_reclaim_for_s("367d").unwrap_err().contains("over a year"));
    }

    #[test]
    fn reclaims_read_as_gpus_time_and_the_work_on_them() {
        let hour_us = 3_600_000_000;
        let now = 1_764_424_987_000_000;
        let lease = |lease_id, tier: &str, gpus: Vec<u8>, stop_at_us, credit_micros| ReclaimedLease {
            lease_id,
            job_id: lease_id + 100,
            tier: tier.to_string(),
            gpus,
            stop_at_us,
            expected_end_us: now + 3 * hour_us,
            credit_micros,
        };
        let view = ReclaimView {
            node_id: 4,
            gpus: vec![0, 1, 2],
            until_us: Some(now + 2 * hour_us),
            stopping: vec![
                lease(1, "bronze", vec![0], Some(now + 30_000_000), 0),
                lease(2, "gold", vec![1], Some(now + 30_000_000), 6_000_000),
            ],
            running_on: vec![lease(3, "silver", vec![2], None, 0)],
        };
        let text = reclaim_text(&view, &ReclaimHints::node(4), now);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(
            lines[0],
            "node 4: GPUs 0,1,2 reclaimed until 2025-11-29 16:03:07Z (in 2h00m)"
        );
        assert_eq!(
            lines[1],
            "stops:    bronze job 101 (lease 1, GPU 0); killed at 2025-11-29 14:03:37Z (in 30s); no credit (bronze work)"
        );
        assert!(lines[2].contains("gold job 102") && lines[2].ends_with("its tenant is paid $6.00 from your earnings"));
        assert!(
            lines[3].starts_with("runs on:  silver job 103 (lease 3, GPU 2); expected to end at 2025-11-29 17:03:07Z")
        );
        assert!(lines[4].contains("`fallow node reclaim 4 --force` stops it"), "{text}");

        let forever = ReclaimView {
            node_id: 4,
            gpus: vec![1],
            ..ReclaimView::default()
        };
        let text = reclaim_text(&forever, &ReclaimHints::node(4), now);
        assert!(
            text.starts_with("node 4: GPU 1 reclaimed until `fallow node resume 4`\n"),
            "{text}"
        );
        assert!(text.contains("no work was running"), "{text}");
        let resumed = ReclaimView {
            node_id: 4,
            ..ReclaimView::default()
        };
        assert!(reclaim_text(&resumed, &ReclaimHints::node(4), now).contains("resumed"));
    }

    #[test]
    fn times_parse_as_rfc_3339() {
        assert_eq!(parse_time_us("1970-01-01T00:00:00Z"), Ok(0));
        assert_eq!(parse_time_us("2025-11-29T14:03:07Z"), Ok(1_764_424_987_000_000));
        assert_eq!(parse_time_us("2025-11-29T15:03+01:00"), Ok(1_764_424_980_000_000));
        assert_eq!(parse_time_us("2025-11-29 14:03:07.5Z"), Ok(1_764_424_987_000_000));
        assert!(parse_time_us("tomorrow").is_err());
        assert!(parse_time_us("2025-13-01T00:00Z").is_err());
    }
}
