//! `fallow tenant`: a tenant's money (the balance, a month's usage by job, the ledger) and the
//! provider accounts it links as its own (hybrid).

use anyhow::bail;
use api::{BalanceView, InvoiceView, OwnProviderList, StatementView};
use clap::{Args, Subcommand};

use super::output::{self, Align, Table, dollars, utc};
use super::{Client, Connection, parse};

#[derive(Args)]
pub struct TenantArgs {
    #[command(flatten)]
    connection: Connection,
    #[command(subcommand)]
    command: TenantCommand,
}

#[derive(Subcommand)]
enum TenantCommand {
    /// Money available to spend, and held in escrow for running jobs.
    Balance,
    /// A month's usage per job, with credits, refunds and payments (the invoice); `--ledger`
    /// lists the ledger's entries instead.
    Usage {
        /// The month, YYYY-MM (UTC; default: this month).
        #[arg(long, value_name = "YYYY-MM")]
        period: Option<String>,
        /// The account's ledger entries, newest first, instead of the invoice.
        #[arg(long, conflicts_with = "period")]
        ledger: bool,
    },
    /// Link a provider account of your own organisation, proven by its API key: your jobs then
    /// go to its nodes first, at no market price, and to the market only for what does not fit
    /// there; its nodes still sell their idle time to others.
    Link {
        /// A file holding the provider account's API key (e.g. `fallow dev`'s provider.key).
        #[arg(long, value_name = "PATH")]
        provider_key_file: std::path::PathBuf,
    },
    /// The provider accounts you linked as your own, with their nodes and GPUs.
    Links,
    /// Unlink one: your jobs buy its nodes' time on the market again.
    Unlink {
        /// The provider account's id.
        provider_id: i64,
    },
}

pub fn run(args: TenantArgs) -> anyhow::Result<()> {
    let client = Client::connect(&args.connection)?;
    match args.command {
        TenantCommand::Balance => balance(&client),
        TenantCommand::Usage { ledger: true, .. } => statement(&client),
        TenantCommand::Usage { period, .. } => usage(&client, period.unwrap_or_else(output::this_month)),
        TenantCommand::Link { provider_key_file } => {
            let key = std::fs::read_to_string(&provider_key_file)
                .map_err(|error| anyhow::anyhow!("--provider-key-file {}: {error}", provider_key_file.display()))?;
            let answer = client.post("/v1/own-providers", &serde_json::json!({"provider_key": key.trim()}))?;
            links(&client, &answer)
        }
        TenantCommand::Links => links(&client, &client.get("/v1/own-providers", &[])?),
        TenantCommand::Unlink { provider_id } => {
            let path = format!("/v1/own-providers/{provider_id}");
            links(&client, &client.send(reqwest::Method::DELETE, &path, &[], None)?)
        }
    }
}

fn links(client: &Client, answer: &serde_json::Value) -> anyhow::Result<()> {
    if client.json {
        output::print_json(answer);
        return Ok(());
    }
    let list: OwnProviderList = parse(answer, "own providers")?;
    if list.providers.is_empty() {
        println!(
            "no provider accounts linked: your jobs buy on the market (`fallow tenant link --provider-key-file F`)"
        );
        return Ok(());
    }
    let mut table = Table::new(&[
        ("PROVIDER", Align::Right),
        ("NAME", Align::Left),
        ("NODES", Align::Right),
        ("GPUS", Align::Right),
        ("LINKED", Align::Left),
    ]);
    for provider in &list.providers {
        table.row(vec![
            provider.provider_id.to_string(),
            provider.name.clone(),
            provider.nodes.to_string(),
            provider.gpus.to_string(),
            utc(provider.linked_at_us),
        ]);
    }
    table.print();
    println!("your jobs go to these nodes first, at no market price; the market takes what does not fit");
    Ok(())
}

fn balance(client: &Client) -> anyhow::Result<()> {
    let answer = client.get("/v1/balance", &[])?;
    if client.json {
        output::print_json(&answer);
        return Ok(());
    }
    let balance: BalanceView = parse(&answer, "balance")?;
    output::print_fields(&[
        ("account", balance.account_id.to_string()),
        ("available", dollars(balance.available_micros)),
        ("in escrow", dollars(balance.escrow_micros)),
    ]);
    Ok(())
}

fn usage(client: &Client, period: String) -> anyhow::Result<()> {
    let well_formed = period.len() == 7
        && period.as_bytes()[4] == b'-'
        && period
            .bytes()
            .enumerate()
            .all(|(at, byte)| at == 4 || byte.is_ascii_digit());
    if !well_formed {
        bail!(
            "--period {period:?} is not a month as YYYY-MM, e.g. {}",
            output::this_month()
        );
    }
    let answer = client.get("/v1/invoices", &[("period", period)])?;
    if client.json {
        output::print_json(&answer);
        return Ok(());
    }
    let invoice: InvoiceView = parse(&answer, "invoice")?;
    println!("usage in {} (UTC), account {}", invoice.period, invoice.account_id);
    if invoice.lines.is_empty() {
        println!("no usage charged this month");
    } else {
        let mut table = Table::new(&[
            ("JOB", Align::Right),
            ("NAME", Align::Left),
            ("RECORDS", Align::Right),
            ("CHARGED", Align::Right),
        ]);
        for line in &invoice.lines {
            table.row(vec![
                line.job_id.to_string(),
                line.job_name.clone(),
                line.usage_records.to_string(),
                dollars(line.charged_micros),
            ]);
        }
        table.print();
    }
    println!();
    output::print_fields(&[
        ("usage", dollars(invoice.usage_micros)),
        ("SLA credits", dollars(-invoice.sla_credits_micros)),
        ("refunds", dollars(-invoice.refunds_micros)),
        ("total", dollars(invoice.total_micros)),
        ("payments", dollars(invoice.payments_micros)),
    ]);
    Ok(())
}

fn statement(client: &Client) -> anyhow::Result<()> {
    let answer = client.get("/v1/statement", &[])?;
    if client.json {
        output::print_json(&answer);
        return Ok(());
    }
    let statement: StatementView = parse(&answer, "statement")?;
    if statement.lines.is_empty() {
        println!("no ledger entries yet for account {}", statement.account_id);
        return Ok(());
    }
    let mut table = Table::new(&[
        ("AT", Align::Left),
        ("KIND", Align::Left),
        ("AMOUNT", Align::Right),
        ("TRANSACTION", Align::Left),
    ]);
    for line in &statement.lines {
        table.row(vec![
            utc(line.at_us),
            line.kind.clone(),
            dollars(line.amount_micros),
            line.transaction.clone(),
        ]);
    }
    table.print();
    Ok(())
}
