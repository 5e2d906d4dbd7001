//! `fallow admin`: accounts, API keys, credits, providers' bonds and fraud decisions, with an
//! admin's key.

use api::{AccountView, BalanceView, KeyView, NewAccountResponse, NewKeyResponse, SiteView, TrustView};
use clap::{Args, Subcommand};
use reqwest::Method;
use serde_json::json;

use super::output::{self, Align, Table, dollars, utc, utc_or_dash};
use super::{Client, Connection, parse};

#[derive(Args)]
pub struct AdminArgs {
    #[command(flatten)]
    connection: Connection,
    #[command(subcommand)]
    command: AdminCommand,
}

#[derive(Subcommand)]
enum AdminCommand {
    /// Accounts of tenants, providers and admins.
    #[command(subcommand)]
    Account(AccountCommand),
    /// API keys of an account.
    #[command(subcommand)]
    Key(KeyCommand),
    /// Credit a tenant's balance (the stand-in for a payment), in dollars.
    Credit {
        /// The tenant's account id.
        account: i64,
        /// Dollars, e.g. 100.00.
        amount: String,
        /// An idempotency key: crediting again with the same key credits once (default: a new
        /// one each time, so retry with --key to be safe).
        #[arg(long)]
        key: Option<String>,
    },
    /// Post a bond for a provider, paid in from outside (the stand-in for a payment), in
    /// dollars; the gold badge needs $50 per GPU offered (docs/trust-policy.md § 2, § 6).
    Bond {
        /// The provider's account id.
        #[arg(long = "provider", value_name = "ID")]
        provider_id: i64,
        /// Dollars, e.g. 500.00.
        amount: String,
        /// An idempotency key: posting again with the same key posts once (retry with it).
        #[arg(long)]
        key: String,
    },
    /// Sites' coordinates: set once for a site, they are every node's there that declares none
    /// (`fallow agent` without --latitude/--longitude), for placement near a job's users.
    #[command(subcommand)]
    Site(SiteCommand),
    /// Every fraud decision: the rule applied, what was slashed and refunded (`--json` adds the
    /// evidence: the signed records and canary results).
    Frauds,
}

#[derive(Subcommand)]
enum SiteCommand {
    /// Set a site's coordinates; its nodes that declare none move to them.
    Set {
        /// The site's name, as its nodes' agents give it (--site).
        name: String,
        /// Degrees north (−90…90).
        #[arg(long, allow_hyphen_values = true)]
        latitude: f64,
        /// Degrees east (−180…180).
        #[arg(long, allow_hyphen_values = true)]
        longitude: f64,
    },
    /// Every site with coordinates, and how many nodes take them.
    List,
}

#[derive(Subcommand)]
enum AccountCommand {
    /// Create an account; prints its first API key, shown only this once.
    Create {
        /// The account's name.
        name: String,
        /// What the account's keys may do.
        #[arg(long, value_parser = ["tenant", "provider", "admin"])]
        role: String,
    },
    /// Every account.
    List,
}

#[derive(Subcommand)]
enum KeyCommand {
    /// Make another key for an account; prints it, shown only this once.
    Create {
        /// The account's id.
        account: i64,
        /// What the key is for, for people.
        #[arg(long, default_value = "")]
        label: String,
    },
    /// An account's keys (ids and labels; never the secrets).
    List {
        /// The account's id.
        account: i64,
    },
    /// Revoke a key by its id: it stops working within seconds.
    Revoke {
        /// The key's id (the 12 hex characters after `fallow_`).
        key_id: String,
    },
}

pub fn run(args: AdminArgs) -> anyhow::Result<()> {
    let client = Client::connect(&args.connection)?;
    match args.command {
        AdminCommand::Account(AccountCommand::Create { name, role }) => account_create(&client, &name, &role),
        AdminCommand::Account(AccountCommand::List) => account_list(&client),
        AdminCommand::Key(KeyCommand::Create { account, label }) => key_create(&client, account, &label),
        AdminCommand::Key(KeyCommand::List { account }) => key_list(&client, account),
        AdminCommand::Key(KeyCommand::Revoke { key_id }) => key_revoke(&client, &key_id),
        AdminCommand::Credit { account, amount, key } => credit(&client, account, &amount, key),
        AdminCommand::Bond {
            provider_id,
            amount,
            key,
        } => bond(&client, provider_id, &amount, &key),
        AdminCommand::Site(SiteCommand::Set {
            name,
            latitude,
            longitude,
        }) => site_set(&client, &name, latitude, longitude),
        AdminCommand::Site(SiteCommand::List) => site_list(&client),
        AdminCommand::Frauds => super::provider::frauds(&client),
    }
}

fn site_set(client: &Client, name: &str, latitude: f64, longitude: f64) -> anyhow::Result<()> {
    let path = format!("/v1/sites/{}", path_segment(name));
    let answer = client.put(&path, &json!({"latitude": latitude, "longitude": longitude}))?;
    if client.json {
        output::print_json(&answer);
        return Ok(());
    }
    let site: SiteView = parse(&answer, "site")?;
    println!(
        "site {} at {:.4}, {:.4}; {} node(s) there take these coordinates",
        site.name, site.latitude, site.longitude, site.nodes
    );
    Ok(())
}

fn site_list(client: &Client) -> anyhow::Result<()> {
    let answer = client.get("/v1/sites", &[])?;
    if client.json {
        output::print_json(&answer);
        return Ok(());
    }
    let sites: Vec<SiteView> = parse(&answer, "site list")?;
    let mut table = Table::new(&[
        ("SITE", Align::Left),
        ("LATITUDE", Align::Right),
        ("LONGITUDE", Align::Right),
        ("NODES", Align::Right),
        ("SET", Align::Left),
    ]);
    for site in &sites {
        table.row(vec![
            site.name.clone(),
            format!("{:.4}", site.latitude),
            format!("{:.4}", site.longitude),
            site.nodes.to_string(),
            utc(site.updated_at_us),
        ]);
    }
    table.print();
    Ok(())
}

/// `text` as one URL path segment: every byte but RFC 3986's unreserved ones percent-encoded.
pub(super) fn path_segment(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for byte in text.bytes() {
        if byte.is_ascii_alphanumeric() || matches!(byte, b'-' | b'.' | b'_' | b'~') {
            out.push(byte as char);
        } else {
            out.push_str(&format!("%{byte:02X}"));
        }
    }
    out
}

fn account_create(client: &Client, name: &str, role: &str) -> anyhow::Result<()> {
    let answer = client.post("/v1/admin/accounts", &json!({"role": role, "name": name}))?;
    if client.json {
        output::print_json(&answer);
        return Ok(());
    }
    let created: NewAccountResponse = parse(&answer, "new account")?;
    output::print_fields(&[
        ("account", created.account.id.to_string()),
        ("role", created.account.role.clone()),
        ("name", created.account.name.clone()),
        ("key id", created.api_key.key_id.clone()),
        ("API key", created.api_key.api_key.clone()),
    ]);
    eprintln!("the API key is shown only now: keep it (FALLOW_API_KEY, or api_key in the config file)");
    Ok(())
}

fn account_list(client: &Client) -> anyhow::Result<()> {
    let answer = client.get("/v1/admin/accounts", &[])?;
    if client.json {
        output::print_json(&answer);
        return Ok(());
    }
    let accounts: Vec<AccountView> = parse(&answer, "account list")?;
    let mut table = Table::new(&[
        ("ID", Align::Right),
        ("ROLE", Align::Left),
        ("NAME", Align::Left),
        ("CREATED", Align::Left),
    ]);
    for account in &accounts {
        table.row(vec![
            account.id.to_string(),
            account.role.clone(),
            account.name.clone(),
            utc(account.created_at_us),
        ]);
    }
    table.print();
    Ok(())
}

fn key_create(client: &Client, account: i64, label: &str) -> anyhow::Result<()> {
    let answer = client.post(&format!("/v1/accounts/{account}/keys"), &json!({"label": label}))?;
    if client.json {
        output::print_json(&answer);
        return Ok(());
    }
    let key: NewKeyResponse = parse(&answer, "new key")?;
    output::print_fields(&[("key id", key.key_id.clone()), ("API key", key.api_key.clone())]);
    eprintln!("the API key is shown only now: keep it");
    Ok(())
}

fn key_list(client: &Client, account: i64) -> anyhow::Result<()> {
    let answer = client.get(&format!("/v1/accounts/{account}/keys"), &[])?;
    if client.json {
        output::print_json(&answer);
        return Ok(());
    }
    let keys: Vec<KeyView> = parse(&answer, "key list")?;
    let mut table = Table::new(&[
        ("KEY ID", Align::Left),
        ("LABEL", Align::Left),
        ("CREATED", Align::Left),
        ("REVOKED", Align::Left),
    ]);
    for key in &keys {
        table.row(vec![
            key.key_id.clone(),
            key.label.clone(),
            utc(key.created_at_us),
            utc_or_dash(key.revoked_at_us),
        ]);
    }
    table.print();
    Ok(())
}

fn key_revoke(client: &Client, key_id: &str) -> anyhow::Result<()> {
    client.send(Method::POST, &format!("/v1/keys/{key_id}/revoke"), &[], None)?;
    if client.json {
        output::print_json(&json!({"key_id": key_id, "revoked": true}));
    } else {
        println!("key {key_id} revoked");
    }
    Ok(())
}

fn credit(client: &Client, account: i64, amount: &str, key: Option<String>) -> anyhow::Result<()> {
    let key = key.unwrap_or_else(|| format!("cli-{account}-{}-{}", output::now_us(), std::process::id()));
    let amount = amount.trim().trim_start_matches('$');
    let answer = client.post(
        "/v1/admin/credits",
        &json!({"account_id": account, "amount": amount, "key": key}),
    )?;
    if client.json {
        output::print_json(&answer);
        return Ok(());
    }
    let balance: BalanceView = parse(&answer, "balance")?;
    println!(
        "account {} credited ${amount}; available now {}",
        balance.account_id,
        dollars(balance.available_micros)
    );
    Ok(())
}

fn bond(client: &Client, provider_id: i64, amount: &str, key: &str) -> anyhow::Result<()> {
    let amount = super::provider::bond_amount(amount);
    let answer = client.post(
        "/v1/admin/bonds",
        &json!({"provider_id": provider_id, "amount": amount, "key": key}),
    )?;
    if client.json {
        output::print_json(&answer);
        return Ok(());
    }
    let view: TrustView = parse(&answer, "trust standing")?;
    println!(
        "bond of {} posted for provider {provider_id} with key {key} (the same key posts once)",
        super::provider::amount_text(amount)
    );
    println!("{}", super::provider::bond_summary(&view));
    Ok(())
}
