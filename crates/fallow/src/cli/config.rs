//! The CLI's config file: `$FALLOW_CONFIG`, else `$XDG_CONFIG_HOME/fallow/config.toml`, else
//! `~/.config/fallow/config.toml`. It holds at most four settings, so it is read by hand as the
//! small part of TOML it needs: `key = "string"` lines and `#` comments.
//!
//! ```toml
//! url = "https://fallow.example:7070"
//! api_key = "fallow_…"          # or: api_key_file = "/path/to/tenant.key"
//! ca_cert = "ca.pem"            # a private CA that signed the coordinator's certificate
//! ```

use std::fmt;
use std::path::{Path, PathBuf};

use anyhow::{Context, bail};

/// The largest config file read: it holds four short lines.
const CONFIG_BYTES_MAX: u64 = 64 * 1024;

/// Where a setting came from, for messages.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Source {
    Flag(&'static str),
    Env(&'static str),
    ConfigFile(String),
    Default,
}

impl fmt::Display for Source {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Source::Flag(name) => write!(f, "{name}"),
            Source::Env(name) => write!(f, "{name}"),
            Source::ConfigFile(path) => write!(f, "the config file {path}"),
            Source::Default => write!(f, "the default"),
        }
    }
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Config {
    /// The file read, or the one that would be (None when no home is known).
    pub path: Option<PathBuf>,
    pub url: Option<String>,
    api_key: Option<String>,
    api_key_file: Option<String>,
    ca_cert: Option<String>,
}

impl Config {
    /// Reads the config file; a missing default file is an empty config, a missing file that
    /// `FALLOW_CONFIG` names is an error.
    pub fn load() -> anyhow::Result<Config> {
        let named = non_empty_env("FALLOW_CONFIG");
        let path = match &named {
            Some(path) => Some(PathBuf::from(path)),
            None => default_path(),
        };
        let Some(path) = path else {
            return Ok(Config::default());
        };
        let text = match std::fs::metadata(&path) {
            Ok(metadata) if metadata.len() > CONFIG_BYTES_MAX => {
                bail!(
                    "{} is over {CONFIG_BYTES_MAX} bytes; is it a Fallow config file?",
                    path.display()
                )
            }
            Ok(_) => std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?,
            Err(error) if error.kind() == std::io::ErrorKind::NotFound && named.is_none() => String::new(),
            Err(error) => {
                bail!("FALLOW_CONFIG names {}, which cannot be read: {error}", path.display())
            }
        };
        let mut config = Config::parse(&text).with_context(|| format!("in {}", path.display()))?;
        config.path = Some(path);
        Ok(config)
    }

    /// Parses `key = "value"` lines; unknown keys and anything else are errors with the line.
    pub fn parse(text: &str) -> anyhow::Result<Config> {
        let mut config = Config::default();
        for (number, key, rest) in settings(text, "key = \"value\"")? {
            let value = parse_string(&rest).with_context(|| format!("line {number}"))?;
            let slot = match key.as_str() {
                "url" => &mut config.url,
                "api_key" => &mut config.api_key,
                "api_key_file" => &mut config.api_key_file,
                "ca_cert" => &mut config.ca_cert,
                other => bail!("line {number}: unknown setting {other:?}; known: url, api_key, api_key_file, ca_cert"),
            };
            if slot.is_some() {
                bail!("line {number}: {key} is set twice");
            }
            *slot = Some(value);
        }
        if config.api_key.is_some() && config.api_key_file.is_some() {
            bail!("give api_key or api_key_file, not both");
        }
        Ok(config)
    }

    /// The key the file gives, read from `api_key_file` (relative to the config file) if that
    /// is how it gives it.
    pub fn api_key(&self) -> anyhow::Result<Option<String>> {
        if let Some(key) = &self.api_key {
            return Ok(Some(key.clone()));
        }
        let Some(file) = &self.api_key_file else {
            return Ok(None);
        };
        let file = self.beside(file);
        let key = std::fs::read_to_string(&file).with_context(|| {
            format!(
                "api_key_file in {} names {}, which cannot be read",
                self.path_shown(),
                file.display()
            )
        })?;
        Ok(Some(key.trim().to_string()))
    }

    /// The CA file `ca_cert` names (relative to the config file), as text.
    pub fn ca_cert(&self) -> Option<String> {
        self.ca_cert
            .as_deref()
            .map(|file| self.beside(file).display().to_string())
    }

    /// `file` relative to the config file's folder.
    fn beside(&self, file: &str) -> PathBuf {
        match self.path.as_deref().and_then(Path::parent) {
            Some(folder) => folder.join(file),
            None => PathBuf::from(file),
        }
    }

    /// The file's path for messages.
    pub fn path_shown(&self) -> String {
        self.path.as_ref().map_or_else(
            || "~/.config/fallow/config.toml".to_string(),
            |path| path.display().to_string(),
        )
    }
}

/// The flag's value, else the environment variable's, else the config file's.
pub fn pick(
    flag: Option<String>,
    flag_name: &'static str,
    env_name: &'static str,
    from_config: Option<String>,
    config_path: &str,
) -> Option<(String, Source)> {
    if let Some(value) = flag {
        return Some((value, Source::Flag(flag_name)));
    }
    if let Some(value) = non_empty_env(env_name) {
        return Some((value, Source::Env(env_name)));
    }
    from_config.map(|value| (value, Source::ConfigFile(config_path.to_string())))
}

fn non_empty_env(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|value| !value.trim().is_empty())
}

fn default_path() -> Option<PathBuf> {
    if let Some(folder) = non_empty_env("XDG_CONFIG_HOME") {
        return Some(PathBuf::from(folder).join("fallow/config.toml"));
    }
    non_empty_env("HOME").map(|home| PathBuf::from(home).join(".config/fallow/config.toml"))
}

/// A TOML basic string (`"…"` with `\"`, `\\`, `\n`, `\t` escapes) or literal string (`'…'`),
/// optionally followed by a comment.
/// The `key = value` lines of a config file, blank lines and `#` comments left out: each line's
/// number, its key and its value's text, both trimmed. A line of another shape is an error
/// saying the `shape` expected.
pub(crate) fn settings(text: &str, shape: &str) -> anyhow::Result<Vec<(usize, String, String)>> {
    let mut out = Vec::new();
    for (number, line) in text.lines().enumerate() {
        let number = number + 1;
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let Some((key, rest)) = line.split_once('=') else {
            bail!("line {number}: expected `{shape}`, found {line:?}");
        };
        out.push((number, key.trim().to_string(), rest.trim().to_string()));
    }
    Ok(out)
}

pub(crate) fn parse_string(text: &str) -> anyhow::Result<String> {
    let mut chars = text.chars();
    let quote = match chars.next() {
        Some(quote @ ('"' | '\'')) => quote,
        _ => bail!("a value is a quoted string, like \"http://127.0.0.1:7070\"; found {text:?}"),
    };
    let mut value = String::new();
    loop {
        match chars.next() {
            None => bail!("the string {text} has no closing {quote}"),
            Some(c) if c == quote => break,
            Some('\\') if quote == '"' => match chars.next() {
                Some('"') => value.push('"'),
                Some('\\') => value.push('\\'),
                Some('n') => value.push('\n'),
                Some('t') => value.push('\t'),
                other => bail!("unsupported escape \\{} in {text}", other.unwrap_or(' ')),
            },
            Some(c) => value.push(c),
        }
    }
    let rest = chars.as_str().trim();
    if !rest.is_empty() && !rest.starts_with('#') {
        bail!("unexpected {rest:?} after the string");
    }
    Ok(value)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_files_parse() {
        let config =
            Config::parse("# Fallow\n\nurl = \"http://h:1\"  # the coordinator\napi_key='fallow_x'\n").unwrap();
        assert_eq!(config.url.as_deref(), Some("http://h:1"));
        assert_eq!(config.api_key().unwrap().as_deref(), Some("fallow_x"));
        assert_eq!(config.ca_cert(), None);
        let mut config = Config::parse("ca_cert = \"ca.pem\"").unwrap();
        config.path = Some(PathBuf::from("/etc/fallow/config.toml"));
        assert_eq!(config.ca_cert().as_deref(), Some("/etc/fallow/ca.pem"));
        let escaped = Config::parse(r#"url = "a\"b\\c""#).unwrap();
        assert_eq!(escaped.url.as_deref(), Some(r#"a"b\c"#));
    }

    #[test]
    fn bad_config_files_say_where() {
        for (text, says) in [
            ("url = http://h", "quoted string"),
            ("url = \"h", "no closing"),
            ("colour = \"red\"", "unknown setting"),
            ("url = \"a\"\nurl = \"b\"", "line 2: url is set twice"),
            ("url", "line 1: expected"),
            ("url = \"a\" b", "unexpected"),
            ("api_key = \"a\"\napi_key_file = \"b\"", "not both"),
        ] {
            let error = format!("{:#}", Config::parse(text).unwrap_err());
            assert!(error.contains(says), "{text}: {error}");
        }
    }
}
