//! `fallow provider`: what a provider's nodes earned and how full they were, its standing under
//! the trust policy (docs/trust-policy.md: badge, bond, reputation with its inputs, canaries),
//! bonds posted from earnings, and the fraud decisions against it.

use api::{CanaryView, EarningsView, FraudView, StatementView, TrustView};
use clap::{Args, Subcommand};
use serde_json::json;
use trust::rules::{CANARY_SLOW_PERMILLE, Outcome};

use super::output::{self, Align, Table, dollars, utc, utc_or_dash};
use super::{Client, Connection, parse};

/// The most entries `GET /v1/statement` holds (the newest): a statement this long may leave
/// charges out, and the platform fee is not worked out from it.
const STATEMENT_LINES_MAX: usize = 1000;

#[derive(Args)]
pub struct ProviderArgs {
    #[command(flatten)]
    connection: Connection,
    #[command(subcommand)]
    command: ProviderCommand,
}

#[derive(Subcommand)]
enum ProviderCommand {
    /// Earnings per node: gross (billed to tenants), GPU-hours sold, fill rate and reliability;
    /// then the platform fee, net and the earnings balance.
    Earnings,
    /// Your standing under the trust policy (docs/trust-policy.md): badge and what the next one
    /// needs, bond, reputation with its inputs, each node's trust and last canary, and fraud
    /// decided.
    Trust {
        /// The provider's account id (admins only; a provider sees its own standing).
        #[arg(long = "provider", value_name = "ID")]
        provider_id: Option<i64>,
    },
    /// Post a bond from your earnings, in dollars. The gold badge needs $50 per GPU offered; a
    /// bond is slashed when fraud is proven (docs/trust-policy.md § 6).
    Bond {
        /// Dollars, e.g. 100.00.
        amount: String,
        /// An idempotency key: posting again with the same key posts once (retry with it).
        #[arg(long)]
        key: String,
    },
    /// Fraud decisions against your nodes: the rule applied, what was slashed and refunded
    /// (`--json` adds the evidence: the signed records and canary results).
    Frauds,
}

pub fn run(args: ProviderArgs) -> anyhow::Result<()> {
    let client = Client::connect(&args.connection)?;
    match args.command {
        ProviderCommand::Earnings => earnings(&client),
        ProviderCommand::Trust { provider_id } => standing(&client, provider_id),
        ProviderCommand::Bond { amount, key } => bond(&client, &amount, &key),
        ProviderCommand::Frauds => frauds(&client),
    }
}

fn earnings(client: &Client) -> anyhow::Result<()> {
    let answer = client.get("/v1/earnings", &[])?;
    if client.json {
        output::print_json(&answer);
        return Ok(());
    }
    let earnings: EarningsView = parse(&answer, "earnings")?;
    if earnings.nodes.is_empty() {
        println!("no nodes yet: start `fallow agent` on a GPU host with your provider key to register one");
    } else {
        let mut table = Table::new(&[
            ("NODE", Align::Right),
            ("NAME", Align::Left),
            ("GROSS", Align::Right),
            ("GPU-HOURS", Align::Right),
            ("FILL", Align::Right),
            ("RELIABILITY", Align::Right),
        ]);
        for node in &earnings.nodes {
            table.row(vec![
                node.node_id.to_string(),
                node.name.clone(),
                dollars(node.earned_micros),
                format!("{:.2}", node.gpu_hours_sold),
                format!("{:.1}%", node.fill_rate * 100.0),
                format!("{:.3}", node.reliability),
            ]);
        }
        table.print();
        println!();
    }
    let gross_micros: i64 = earnings.nodes.iter().map(|node| node.earned_micros).sum();
    // What the usage charges credited, net of the fee, from the statement (when it holds them all).
    let usage_net_micros = if gross_micros > 0 {
        let statement: StatementView = parse(&client.get("/v1/statement", &[])?, "statement")?;
        (statement.lines.len() < STATEMENT_LINES_MAX).then(|| {
            statement
                .lines
                .iter()
                .filter(|line| line.kind == "usage")
                .map(|line| line.amount_micros)
                .sum::<i64>()
        })
    } else {
        None
    };
    output::print_fields(&earnings_fields(
        earnings.provider_id,
        gross_micros,
        usage_net_micros,
        earnings.earnings_micros,
    ));
    Ok(())
}

/// The lines under the earnings table: gross, the platform fee and net (worked out from what
/// the usage charges credited, `usage_net_micros`, when that is known), and the balance.
fn earnings_fields(
    provider_id: i64,
    gross_micros: i64,
    usage_net_micros: Option<i64>,
    balance_micros: i64,
) -> Vec<(&'static str, String)> {
    let mut pairs = vec![
        ("provider", provider_id.to_string()),
        (
            "gross",
            format!("{} (billed to tenants for your nodes' GPU time)", dollars(gross_micros)),
        ),
    ];
    match usage_net_micros {
        Some(net_micros) if gross_micros > 0 && (0..=gross_micros).contains(&net_micros) => {
            let fee_micros = gross_micros - net_micros;
            let fee_permille =
                (i128::from(fee_micros) * 1000 + i128::from(gross_micros) / 2) / i128::from(gross_micros);
            pairs.push((
                "platform fee",
                format!(
                    "{} ({}.{} % of gross)",
                    dollars(fee_micros),
                    fee_permille / 10,
                    fee_permille % 10
                ),
            ));
            pairs.push(("net", format!("{} (gross less the platform fee)", dollars(net_micros))));
        }
        _ => pairs.push((
            "platform fee",
            "kept from each charge: net = gross less the fee".to_string(),
        )),
    }
    pairs.push((
        "earnings balance",
        format!("{} (net, less bonds posted from it)", dollars(balance_micros)),
    ));
    pairs
}

fn standing(client: &Client, provider_id: Option<i64>) -> anyhow::Result<()> {
    let query: Vec<(&str, String)> = provider_id
        .map(|id| ("provider_id", id.to_string()))
        .into_iter()
        .collect();
    let answer = client.get("/v1/trust", &query)?;
    if client.json {
        output::print_json(&answer);
        return Ok(());
    }
    let view: TrustView = parse(&answer, "trust standing")?;
    print!("{}", standing_text(&view));
    Ok(())
}

/// The whole standing, for people.
fn standing_text(view: &TrustView) -> String {
    let mut out = output::fields(&[
        ("provider", view.provider_id.to_string()),
        ("badge", view.badge.clone()),
        ("next badge", next_badge_text(view)),
        ("bond", dollars(view.bond_micros)),
        (
            "gold bond needed",
            format!(
                "{} ({} per GPU offered; {} offered)",
                dollars(view.gold_bond_needed_micros),
                dollars(trust::rules::GOLD_BOND_PER_GPU_MICROS),
                view.gpus_offered
            ),
        ),
        (
            "reputation",
            format!(
                "{:.3}, lower bound {:.3} (badges use it), from {:.1} outcomes",
                view.reputation.score, view.reputation.lower_bound, view.reputation.evidence
            ),
        ),
        ("first node registered", utc_or_dash(view.first_registered_at_us)),
        (
            "last fraud proven",
            view.last_fraud_at_us.map_or_else(|| "never".to_string(), utc),
        ),
    ]);
    out.push_str("\nreputation inputs: decayed weight per kind of outcome (docs/trust-policy.md § 1)\n");
    out.push_str(&inputs_table(&view.reputation.inputs).render());
    out.push_str("the prior Beta(8, 2) comes on top; a weight halves every 30 days\n\n");
    if view.nodes.is_empty() {
        out.push_str("no nodes yet: start `fallow agent` on a GPU host with your provider key to register one\n");
    } else {
        let mut table = Table::new(&[
            ("NODE", Align::Right),
            ("NAME", Align::Left),
            ("SCORE", Align::Right),
            ("LOWER BOUND", Align::Right),
            ("GOLD WORK", Align::Left),
            ("CORDONED", Align::Left),
            ("LAST CANARY", Align::Left),
            ("CANARY RATE", Align::Left),
        ]);
        for node in &view.nodes {
            let canary = node.last_canary.as_ref();
            table.row(vec![
                node.node_id.to_string(),
                node.name.clone(),
                format!("{:.3}", node.reputation.score),
                format!("{:.3}", node.reputation.lower_bound),
                if node.gold_eligible { "yes" } else { "no" }.to_string(),
                node.fraud_cordoned_at_us
                    .map_or_else(|| "no".to_string(), |at| format!("since {}", utc(at))),
                canary.map_or_else(|| "none yet".to_string(), |canary| finding_text(canary).to_string()),
                canary.map_or_else(|| "-".to_string(), rate_text),
            ]);
        }
        out.push_str(&table.render());
    }
    out.push('\n');
    if view.frauds.is_empty() {
        out.push_str("no fraud decided against this provider\n");
    } else {
        out.push_str("fraud decided (docs/trust-policy.md § 6; the evidence: `fallow provider frauds --json`)\n");
        out.push_str(&frauds_table(&view.frauds).render());
    }
    out
}

fn inputs_table(inputs: &std::collections::BTreeMap<String, f64>) -> Table {
    let mut table = Table::new(&[
        ("OUTCOME", Align::Left),
        ("COUNTS AS", Align::Left),
        ("WEIGHT", Align::Right),
    ]);
    for (name, weight) in inputs {
        let counts_as = match Outcome::parse(name).map(|outcome| outcome.weight().0) {
            Some(true) => "success",
            Some(false) => "failure",
            None => "-",
        };
        table.row(vec![
            name.replace('_', " "),
            counts_as.to_string(),
            format!("{weight:.1}"),
        ]);
    }
    table
}

/// What the next badge up needs that the provider lacks (docs/trust-policy.md § 2), as the
/// coordinator says.
fn next_badge_text(view: &TrustView) -> String {
    match &view.next_badge {
        None => "none above gold".to_string(),
        Some(badge) if view.next_badge_needs.is_empty() => {
            format!("{badge}: every threshold met; it shows within minutes")
        }
        Some(badge) => format!("{badge} needs {}", view.next_badge_needs.join(", ")),
    }
}

/// A canary's finding, or `running` while it has none.
fn finding_text(canary: &CanaryView) -> &str {
    canary.finding.as_deref().unwrap_or("running")
}

/// Thousandths of a unit per second per GPU as units per second.
fn rate(milli: i64) -> String {
    format!("{:.3}", milli as f64 / 1000.0)
}

/// `1.234 of 1.250 u/s (98.7 %)`: the rate a canary ran at against the claimed model's.
fn rate_text(canary: &CanaryView) -> String {
    let expected = rate(canary.expected_rate_milli);
    match canary.rate_milli {
        Some(measured) if canary.expected_rate_milli > 0 => format!(
            "{} of {expected} u/s ({:.1} %)",
            rate(measured),
            measured as f64 * 100.0 / canary.expected_rate_milli as f64
        ),
        Some(measured) => format!("{} of {expected} u/s", rate(measured)),
        None => format!("- of {expected} u/s"),
    }
}

/// A node's canaries, newest first, as `fallow node canaries` prints them.
pub(super) fn canaries_text(node_id: i64, canaries: &[CanaryView]) -> String {
    if canaries.is_empty() {
        return format!("node {node_id} has had no canary yet: `fallow node verify {node_id}` orders one\n");
    }
    let mut table = Table::new(&[
        ("ID", Align::Right),
        ("ORDERED", Align::Left),
        ("GPUS", Align::Left),
        ("CLAIMED MODEL", Align::Left),
        ("FINDING", Align::Left),
        ("RATE", Align::Left),
        ("FINISHED", Align::Left),
    ]);
    for canary in canaries {
        let gpus: Vec<String> = canary.gpus.iter().map(u8::to_string).collect();
        table.row(vec![
            canary.id.to_string(),
            utc(canary.created_at_us),
            gpus.join(","),
            canary.claimed_model.clone(),
            finding_text(canary).to_string(),
            rate_text(canary),
            utc_or_dash(canary.finished_at_us),
        ]);
    }
    format!(
        "{}rates in units per second per GPU; under {} % of the claimed model's is slow (docs/trust-policy.md § 3); \
         the signed results: --json\n",
        table.render(),
        CANARY_SLOW_PERMILLE / 10
    )
}

fn frauds_table(frauds: &[FraudView]) -> Table {
    let mut table = Table::new(&[
        ("ID", Align::Right),
        ("DECIDED", Align::Left),
        ("PROVIDER", Align::Right),
        ("NODE", Align::Right),
        ("KIND", Align::Left),
        ("SECTION", Align::Left),
        ("SHARE", Align::Right),
        ("SLASHED", Align::Right),
        ("REFUNDED", Align::Right),
        ("TO PLATFORM", Align::Right),
    ]);
    for fraud in frauds {
        let refunded: i64 = fraud.refunds.iter().map(|refund| refund.paid_micros).sum();
        table.row(vec![
            fraud.id.to_string(),
            utc(fraud.decided_at_us),
            fraud.provider_id.to_string(),
            fraud.node_id.to_string(),
            fraud.kind.replace('_', " "),
            fraud.section.clone(),
            format!("{:.1} %", fraud.share_permille as f64 / 10.0),
            format!(
                "{} of {}",
                dollars(fraud.slashed_micros),
                dollars(fraud.bond_before_micros)
            ),
            format!("{} to {} tenant(s)", dollars(refunded), fraud.refunds.len()),
            dollars(fraud.to_platform_micros),
        ]);
    }
    table
}

/// `GET /v1/frauds`: the coordinator lists what concerns the key (a provider's own, every one
/// for an admin).
pub(super) fn frauds(client: &Client) -> anyhow::Result<()> {
    let answer = client.get("/v1/frauds", &[])?;
    if client.json {
        output::print_json(&answer);
        return Ok(());
    }
    let frauds: Vec<FraudView> = parse(&answer, "fraud decisions")?;
    if frauds.is_empty() {
        println!("no fraud decided");
        return Ok(());
    }
    frauds_table(&frauds).print();
    println!(
        "share: of the bond slashed; refunds go to the tenants whose leases ran on the node (docs/trust-policy.md § 6); \
         the evidence, signed records and canary results: --json"
    );
    Ok(())
}

/// What a bond left: the provider's bond now and what it still needs for gold.
pub(super) fn bond_summary(view: &TrustView) -> String {
    let short = view.gold_bond_needed_micros - view.bond_micros;
    format!(
        "provider {}: bond now {}, badge {}; {}",
        view.provider_id,
        dollars(view.bond_micros),
        view.badge,
        if short > 0 {
            format!(
                "the gold badge needs {} more bond (of {})",
                dollars(short),
                dollars(view.gold_bond_needed_micros)
            )
        } else {
            format!(
                "the bond covers the gold badge's {}",
                dollars(view.gold_bond_needed_micros)
            )
        }
    )
}

/// A bond amount as the API takes it: dollars, a `$` allowed.
pub(super) fn bond_amount(amount: &str) -> &str {
    amount.trim().trim_start_matches('$')
}

/// An amount the coordinator took, as money reads (`75` → `$75.00`).
pub(super) fn amount_text(amount: &str) -> String {
    model::Micros::parse_dollars(amount).map_or_else(|| format!("${amount}"), |micros| dollars(micros.0))
}

fn bond(client: &Client, amount: &str, key: &str) -> anyhow::Result<()> {
    let amount = bond_amount(amount);
    let answer = client.post("/v1/provider/bond", &json!({"amount": amount, "key": key}))?;
    if client.json {
        output::print_json(&answer);
        return Ok(());
    }
    let view: TrustView = parse(&answer, "trust standing")?;
    println!(
        "bond of {} posted from earnings with key {key} (the same key posts once)",
        amount_text(amount)
    );
    println!("{}", bond_summary(&view));
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use api::{NodeTrustView, RefundView, ReputationView};

    use super::*;

    const NOW_US: i64 = 1_764_424_987_000_000;

    #[test]
    fn earnings_say_the_difference_between_gross_and_net_is_the_platform_fee() {
        assert_eq!(
            output::fields(&earnings_fields(7, 10_000_000, Some(9_000_001), 4_000_001)),
            "provider:         7\n\
             gross:            $10.00 (billed to tenants for your nodes' GPU time)\n\
             platform fee:     $0.999999 (10.0 % of gross)\n\
             net:              $9.000001 (gross less the platform fee)\n\
             earnings balance: $4.000001 (net, less bonds posted from it)\n"
        );
        let unknown = output::fields(&earnings_fields(7, 10_000_000, None, 9_000_000));
        assert!(
            unknown.contains("platform fee:     kept from each charge: net = gross less the fee"),
            "{unknown}"
        );
    }

    fn reputation(score: f64, lower_bound: f64, evidence: f64) -> ReputationView {
        ReputationView {
            score,
            lower_bound,
            evidence,
            inputs: Outcome::ALL
                .iter()
                .map(|outcome| (outcome.name().to_string(), 0.0))
                .collect::<BTreeMap<_, _>>(),
        }
    }

    fn canary(finding: Option<&str>, rate_milli: Option<i64>) -> CanaryView {
        CanaryView {
            id: 3,
            node_id: 9,
            kind: "hash".into(),
            units: 20,
            gpus: vec![0, 1],
            claimed_model: "H100-SXM5".into(),
            created_at_us: NOW_US - 60_000_000,
            delivered_at_us: None,
            finished_at_us: finding.map(|_| NOW_US),
            finding: finding.map(str::to_string),
            reason: None,
            rate_milli,
            expected_rate_milli: 2000,
            result: None,
            signature_hex: None,
        }
    }

    fn view(badge: &str) -> TrustView {
        TrustView {
            provider_id: 7,
            bond_micros: 100_000_000,
            badge: badge.into(),
            reputation: reputation(0.8, 0.56, 0.0),
            gpus_offered: 4,
            gold_bond_needed_micros: 200_000_000,
            first_registered_at_us: Some(NOW_US - 3 * 86_400_000_000),
            last_fraud_at_us: None,
            next_badge: Some("bronze".into()),
            next_badge_needs: vec![
                "a lower bound of 0.85 (now 0.560)".into(),
                "10 outcomes (now 0.0)".into(),
            ],
            nodes: Vec::new(),
            frauds: Vec::new(),
        }
    }

    #[test]
    fn the_next_badge_says_what_it_lacks() {
        let mut fresh = view("none");
        assert_eq!(
            next_badge_text(&fresh),
            "bronze needs a lower bound of 0.85 (now 0.560), 10 outcomes (now 0.0)"
        );
        fresh.next_badge_needs.clear();
        assert_eq!(
            next_badge_text(&fresh),
            "bronze: every threshold met; it shows within minutes"
        );
        fresh.next_badge = None;
        assert_eq!(next_badge_text(&fresh), "none above gold");
    }

    #[test]
    fn canary_rates_read_against_the_claimed_model() {
        assert_eq!(
            rate_text(&canary(Some("slow"), Some(640))),
            "0.640 of 2.000 u/s (32.0 %)"
        );
        assert_eq!(rate_text(&canary(None, None)), "- of 2.000 u/s");
        assert_eq!(finding_text(&canary(None, None)), "running");
        let text = canaries_text(9, &[canary(Some("passed"), Some(1990))]);
        assert!(text.starts_with("ID  ORDERED "), "{text}");
        assert!(
            text.contains("passed") && text.contains("(99.5 %)") && text.contains("under 60 %"),
            "{text}"
        );
        assert!(canaries_text(9, &[]).contains("`fallow node verify 9`"));
    }

    #[test]
    fn the_standing_shows_inputs_nodes_and_frauds() {
        let mut standing = view("none");
        standing.reputation.inputs.insert("canary_failed".into(), 5.0);
        standing.nodes.push(NodeTrustView {
            node_id: 9,
            name: "gpu-a".into(),
            reputation: reputation(0.75, 0.5, 5.0),
            fraud_cordoned_at_us: Some(NOW_US),
            gold_eligible: false,
            last_canary: Some(canary(Some("wrong_answer"), Some(2000))),
        });
        standing.frauds.push(FraudView {
            id: 1,
            node_id: 9,
            provider_id: 7,
            kind: "wrong_answers".into(),
            section: "§ 3".into(),
            share_permille: 1000,
            bond_before_micros: 100_000_000,
            slashed_micros: 100_000_000,
            refunds: vec![RefundView {
                tenant_id: 2,
                owed_micros: 30_000_000,
                paid_micros: 30_000_000,
            }],
            to_platform_micros: 70_000_000,
            evidence: serde_json::Value::Null,
            decided_at_us: NOW_US,
        });
        let text = standing_text(&standing);
        let line = |start: &str| {
            text.lines()
                .find(|line| line.trim_start().starts_with(start))
                .unwrap_or_else(|| panic!("{start:?} in {text}"))
                .to_string()
        };
        assert!(line("bond:").ends_with("$100.00"), "{text}");
        assert!(line("canary failed").contains("failure") && line("canary failed").ends_with("5.0"));
        assert!(line("lease finished").contains("success"), "{text}");
        let node: Vec<String> = line("9  gpu-a").split_whitespace().map(str::to_string).collect();
        assert_eq!(node[2..6], ["0.750", "0.500", "no", "since"], "{text}");
        assert!(
            node.contains(&"wrong_answer".to_string()) && node.contains(&"(100.0".to_string()),
            "{text}"
        );
        let fraud = line("1  2025-11-29");
        assert!(
            fraud.contains("wrong answers") && fraud.contains("$100.00 of $100.00") && fraud.contains("$30.00 to 1"),
            "{fraud}"
        );
        assert_eq!(
            bond_summary(&standing),
            "provider 7: bond now $100.00, badge none; the gold badge needs $100.00 more bond (of $200.00)"
        );
    }
}
