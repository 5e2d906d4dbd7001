//! The command-line client of the coordinator's API: where to reach it and with which key (flags,
//! environment, config file), one blocking client over reqwest, and API errors turned into
//! messages that say what to do next. The subcommands live beside it, one file per party.

pub mod admin;
pub mod catalog;
pub mod completions;
pub mod config;
pub mod dataset;
pub mod job;
pub mod job_file;
pub mod node;
pub mod offers;
pub mod output;
pub mod provider;
pub mod reserve;
pub mod service;
pub mod tenant;

use std::fmt;
use std::time::Duration;

use anyhow::{Context, bail};
use api::backoff::Backoff;
use clap::Args;
use reqwest::{Method, StatusCode, Url};
use serde::de::DeserializeOwned;
use serde_json::Value;

use config::{Config, Source};

/// The coordinator a CLI talks to when nothing else says.
pub const DEFAULT_URL: &str = "http://127.0.0.1:7070";
/// The longest one API request may take (`job logs --follow` and `--wait` poll, never block).
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);
/// Tries of one request while the coordinator is unreachable or says to come back later (429;
/// 503 for requests that are safe to send twice), with backoff between them: at most about 4 s
/// of waiting, then the error is shown.
pub const REQUEST_ATTEMPTS_MAX: u32 = 5;
/// Where `fallow dev` leaves the demo parties' keys, for error messages.
const KEY_FILES_HINT: &str = "`fallow dev --data-dir D` writes D/tenant.key and D/provider.key, `fallow server` writes the admin's \
     to its data directory's admin.key, and an admin makes more with `fallow admin key create ACCOUNT`";

/// How every client subcommand finds the coordinator, and how it prints.
#[derive(Args, Clone, Debug, Default)]
pub struct Connection {
    /// The coordinator's URL [env: FALLOW_URL; else the config file's `url`; else
    /// http://127.0.0.1:7070].
    #[arg(long, global = true, value_name = "URL", help_heading = "Client options")]
    pub url: Option<String>,
    /// The API key [env: FALLOW_API_KEY; else the config file's `api_key` or `api_key_file`].
    #[arg(long, global = true, value_name = "KEY", help_heading = "Client options")]
    pub api_key: Option<String>,
    /// A PEM file of a private CA to trust, besides the system's roots, for an https://
    /// coordinator [env: FALLOW_CA_CERT; else the config file's `ca_cert`].
    #[arg(long, global = true, value_name = "PATH", help_heading = "Client options")]
    pub ca_cert: Option<String>,
    /// Print JSON (the API's answer) instead of tables, for scripts.
    #[arg(long, global = true, help_heading = "Client options")]
    pub json: bool,
}

/// A blocking client of the coordinator's API: a small runtime of its own drives reqwest.
pub struct Client {
    runtime: tokio::runtime::Runtime,
    http: reqwest::Client,
    base: Url,
    key: String,
    key_source: Source,
    pub json: bool,
}

/// A refusal by the coordinator: the API's message and what to do about it.
#[derive(Debug)]
pub struct ApiFailure {
    pub message: String,
    hint: String,
}

impl fmt::Display for ApiFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.message)?;
        if !self.hint.is_empty() {
            write!(f, "\n  → {}", self.hint)?;
        }
        Ok(())
    }
}

impl std::error::Error for ApiFailure {}

impl Client {
    /// Resolves the URL and key: flag, then environment, then the config file.
    pub fn connect(connection: &Connection) -> anyhow::Result<Client> {
        die_quietly_on_closed_stdout();
        let config = Config::load()?;
        let (url, _) = config::pick(
            connection.url.clone(),
            "--url",
            "FALLOW_URL",
            config.url.clone(),
            &config.path_shown(),
        )
        .unwrap_or((DEFAULT_URL.to_string(), Source::Default));
        let base = parse_base(&url)?;
        let Some((key, key_source)) = config::pick(
            connection.api_key.clone(),
            "--api-key",
            "FALLOW_API_KEY",
            config.api_key()?,
            &config.path_shown(),
        ) else {
            bail!(
                "no API key: set FALLOW_API_KEY, pass --api-key, or put api_key = \"…\" in {}\n  → {KEY_FILES_HINT}",
                config.path_shown()
            );
        };
        let key = key.trim().to_string();
        if let Err(error) = trust::parse_api_key(&key) {
            bail!(
                "the API key from {key_source} is not a Fallow API key: {error}\n  → give the key itself, not the \
                 file that holds it (FALLOW_API_KEY=$(cat D/tenant.key)); {KEY_FILES_HINT}"
            );
        }
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .context("starting the async runtime")?;
        let mut builder = reqwest::Client::builder().timeout(REQUEST_TIMEOUT);
        if let Some((path, source)) = config::pick(
            connection.ca_cert.clone(),
            "--ca-cert",
            "FALLOW_CA_CERT",
            config.ca_cert(),
            &config.path_shown(),
        ) {
            let certs = agent::client::read_ca_certs(std::path::Path::new(&path))
                .map_err(|error| anyhow::anyhow!("the CA certificate from {source}: {error}"))?;
            builder = builder.tls_certs_merge(certs);
        }
        if is_loopback(&base) {
            // A proxy from the environment cannot reach this machine's loopback.
            builder = builder.no_proxy();
        }
        let http = builder.build().context("building the HTTP client")?;
        Ok(Client {
            runtime,
            http,
            base,
            key,
            key_source,
            json: connection.json,
        })
    }

    pub fn get(&self, path: &str, query: &[(&str, String)]) -> anyhow::Result<Value> {
        self.send(Method::GET, path, query, None)
    }

    pub fn post(&self, path: &str, body: &Value) -> anyhow::Result<Value> {
        self.send(Method::POST, path, &[], Some(body))
    }

    pub fn put(&self, path: &str, body: &Value) -> anyhow::Result<Value> {
        self.send(Method::PUT, path, &[], Some(body))
    }

    /// Sends one request and returns the answer's JSON (`null` for an empty answer). A request
    /// that could not connect, was refused as too many (429), or met a coordinator unavailable
    /// (503) when sending it twice is safe, is sent again after a wait with full jitter that
    /// honours `Retry-After`, up to `REQUEST_ATTEMPTS_MAX` tries, saying so on stderr.
    pub fn send(
        &self,
        method: Method,
        path: &str,
        query: &[(&str, String)],
        body: Option<&Value>,
    ) -> anyhow::Result<Value> {
        let (_, bytes) = self.exchange(method.clone(), path, query, body)?;
        let text = String::from_utf8_lossy(&bytes);
        if text.trim().is_empty() {
            return Ok(Value::Null);
        }
        serde_json::from_str(&text).with_context(|| {
            format!(
                "the coordinator's answer to {method} {path} is not JSON; is {} a Fallow coordinator?",
                self.base
            )
        })
    }

    /// A GET whose answer is not JSON (an archive): its headers and bytes.
    pub fn get_bytes(
        &self,
        path: &str,
        query: &[(&str, String)],
    ) -> anyhow::Result<(reqwest::header::HeaderMap, Vec<u8>)> {
        self.exchange(Method::GET, path, query, None)
    }

    /// `send`'s request, tried again as it says; a successful answer's headers and bytes.
    fn exchange(
        &self,
        method: Method,
        path: &str,
        query: &[(&str, String)],
        body: Option<&Value>,
    ) -> anyhow::Result<(reqwest::header::HeaderMap, Vec<u8>)> {
        let mut url = self
            .base
            .join(path.trim_start_matches('/'))
            .context("building the request URL")?;
        if !query.is_empty() {
            let mut pairs = url.query_pairs_mut();
            for (name, value) in query {
                pairs.append_pair(name, value);
            }
        }
        let mut backoff = Backoff::new(
            Duration::from_millis(250),
            Duration::from_secs(8),
            api::backoff::seed_from_clock(0),
        );
        let mut attempt = 1;
        let (status, text) = loop {
            let mut request = self.http.request(method.clone(), url.clone()).bearer_auth(&self.key);
            if let Some(body) = body {
                request = request.json(body);
            }
            let sent = self.runtime.block_on(async {
                let response = request.send().await?;
                let status = response.status();
                let retry_after = response
                    .headers()
                    .get(reqwest::header::RETRY_AFTER)
                    .and_then(|value| value.to_str().ok())
                    .and_then(api::backoff::parse_retry_after);
                let headers = response.headers().clone();
                Ok::<_, reqwest::Error>((status, retry_after, (headers, response.bytes().await?.to_vec())))
            });
            let again = match &sent {
                Ok((status, retry_after, _)) => (*status == StatusCode::TOO_MANY_REQUESTS
                    || (*status == StatusCode::SERVICE_UNAVAILABLE && may_ask_again(&method)))
                .then(|| (status.to_string(), *retry_after)),
                Err(error) if error.is_connect() => Some(("cannot connect".to_string(), None)),
                Err(_) => None,
            };
            match again {
                Some((why, retry_after)) if attempt < REQUEST_ATTEMPTS_MAX => {
                    let wait = backoff.failed(retry_after);
                    eprintln!(
                        "fallow: {method} {path}: {why}; asking again in {:.1} s",
                        wait.as_secs_f64()
                    );
                    self.sleep(wait);
                    attempt += 1;
                }
                _ => {
                    let (status, _, text) = sent.map_err(|error| self.transport_error(&error))?;
                    break (status, text);
                }
            }
        };
        let (headers, bytes) = text;
        if !status.is_success() {
            return Err(self.api_failure(status, &String::from_utf8_lossy(&bytes), path).into());
        }
        Ok((headers, bytes))
    }

    fn transport_error(&self, error: &reqwest::Error) -> anyhow::Error {
        let base = self.base.as_str().trim_end_matches('/');
        let causes = agent::client::with_causes(error);
        if causes.contains("certificate") {
            anyhow::anyhow!(
                "the coordinator at {base} did not show a TLS certificate this client trusts ({causes})\n  → if a \
                 private CA signed it, pass --ca-cert CA.pem (or set FALLOW_CA_CERT, or ca_cert in the config \
                 file); otherwise check that the URL's host is a name the certificate is for"
            )
        } else if self.base.scheme() == "https" && causes.contains("InvalidContentType") {
            anyhow::anyhow!(
                "the coordinator at {base} does not speak TLS ({causes})\n  → if it serves plain HTTP, use an \
                 http:// URL"
            )
        } else if error.is_timeout() {
            anyhow::anyhow!(
                "the coordinator at {base} did not answer within {} s\n  → try again; if it persists, look at the \
                 coordinator's log",
                REQUEST_TIMEOUT.as_secs()
            )
        } else if error.is_connect() {
            anyhow::anyhow!(
                "cannot reach the coordinator at {base}\n  → start one (`fallow server`, or `fallow dev` for a demo \
                 market) or point FALLOW_URL or --url at the one you use"
            )
        } else {
            anyhow::anyhow!("talking to the coordinator at {base}: {causes}")
        }
    }

    fn api_failure(&self, status: StatusCode, text: &str, path: &str) -> ApiFailure {
        let message = match serde_json::from_str::<api::ErrorBody>(text) {
            Ok(body) => body.error.message,
            Err(_) if text.trim().is_empty() => status.to_string(),
            Err(_) => format!("{status}: {}", text.trim()),
        };
        let hint = match status {
            StatusCode::UNAUTHORIZED => {
                return ApiFailure {
                    message: format!("the API key from {} was refused ({message})", self.key_source),
                    hint: format!("set FALLOW_API_KEY or --api-key to a valid key; {KEY_FILES_HINT}"),
                };
            }
            StatusCode::FORBIDDEN => {
                "use a key of the role this command is for, with --api-key or FALLOW_API_KEY".to_string()
            }
            StatusCode::PAYMENT_REQUIRED if path.starts_with("/v1/provider/bond") => {
                "a bond is paid from earnings; an admin may post one paid in from outside: \
                 `fallow admin bond --provider ID AMOUNT --key KEY`"
                    .to_string()
            }
            StatusCode::PAYMENT_REQUIRED => {
                "an admin credits tenants with `fallow admin credit ACCOUNT AMOUNT`".to_string()
            }
            StatusCode::NOT_FOUND => not_found_hint(path).to_string(),
            StatusCode::TOO_MANY_REQUESTS | StatusCode::SERVICE_UNAVAILABLE => "try again in a moment".to_string(),
            status if status.is_server_error() => {
                "the coordinator failed: try again, and look at its log if it persists".to_string()
            }
            _ => String::new(),
        };
        ApiFailure { message, hint }
    }

    /// Waits between polls.
    pub fn sleep(&self, duration: Duration) {
        self.runtime.block_on(async { tokio::time::sleep(duration).await });
    }
}

/// Lets a closed stdout (`fallow job logs 7 | head`) end the process quietly, as it does other
/// command-line tools, instead of failing every print: Rust ignores SIGPIPE by default.
pub fn die_quietly_on_closed_stdout() {
    // SAFETY: setting a signal's disposition to the default has no preconditions; the CLI runs
    // no signal handlers of its own.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
}

/// Whether sending the request twice does what sending it once does (RFC 9110's idempotent
/// methods), so a 503 that may have come after some of the work can be met by sending it again.
fn may_ask_again(method: &Method) -> bool {
    matches!(
        *method,
        Method::GET | Method::HEAD | Method::PUT | Method::DELETE | Method::OPTIONS
    )
}

/// What lists the ids a 404 was about.
fn not_found_hint(path: &str) -> &'static str {
    if path.starts_with("/v1/jobs") {
        "`fallow job list` shows your jobs' ids"
    } else if path.starts_with("/v1/nodes") {
        "`fallow node list` shows your nodes' ids (with a provider's key)"
    } else if path.starts_with("/v1/keys") {
        "`fallow admin key list ACCOUNT` shows an account's keys"
    } else if path.starts_with("/v1/trust") {
        "with an admin's key, name the provider: `fallow provider trust --provider ID`; `fallow admin account \
         list` shows the providers' ids (a provider sees only its own)"
    } else if path.starts_with("/v1/accounts") || path.starts_with("/v1/admin") {
        "`fallow admin account list` shows the accounts' ids"
    } else {
        "is the coordinator the same version as this CLI?"
    }
}

fn parse_base(url: &str) -> anyhow::Result<Url> {
    let mut base = Url::parse(url.trim())
        .with_context(|| format!("{url:?} is not a URL; give one like {DEFAULT_URL} (FALLOW_URL or --url)"))?;
    if !matches!(base.scheme(), "http" | "https") {
        bail!("{url:?} is not an http:// or https:// URL; give one like {DEFAULT_URL}");
    }
    // `join` keeps a base path only up to its last slash.
    if !base.path().ends_with('/') {
        let path = format!("{}/", base.path());
        base.set_path(&path);
    }
    Ok(base)
}

fn is_loopback(url: &Url) -> bool {
    match url.host_str() {
        Some("localhost") => true,
        Some(host) => host
            .trim_start_matches('[')
            .trim_end_matches(']')
            .parse::<std::net::IpAddr>()
            .is_ok_and(|address| address.is_loopback()),
        None => false,
    }
}

/// Parses an API answer into its wire type.
pub fn parse<T: DeserializeOwned>(value: &Value, what: &str) -> anyhow::Result<T> {
    T::deserialize(value).with_context(|| {
        format!("the coordinator's {what} did not parse; is it the same version as this CLI (`fallow --version`)?")
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base_urls_keep_their_path() {
        let base = parse_base("http://example.test/prefix").unwrap();
        assert_eq!(
            base.join("v1/jobs").unwrap().as_str(),
            "http://example.test/prefix/v1/jobs"
        );
        let base = parse_base("http://127.0.0.1:7070").unwrap();
        assert_eq!(base.join("v1/jobs").unwrap().as_str(), "http://127.0.0.1:7070/v1/jobs");
        assert!(is_loopback(&base));
        assert!(parse_base("ftp://example.test").is_err());
        assert!(parse_base("127.0.0.1:7070").is_err());
    }
}
