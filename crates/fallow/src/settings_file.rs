//! The agent's and the server's config file: `--config PATH`, else `FALLOW_AGENT_CONFIG` or
//! `FALLOW_SERVER_CONFIG`, else `/etc/fallow/agent.toml` or `/etc/fallow/server.toml` when
//! present. Its settings are the command's flags, one a line, in the part of TOML they need:
//!
//! ```toml
//! # /etc/fallow/agent.toml
//! coordinator = "https://fallow.example:7070"
//! region = "eu-west"
//! gang-ports = "29500-29999"     # or gang_ports
//! thermal-limit-c = 83
//! allow-file-datasets = false
//! ```
//!
//! A flag beats its environment variable, which beats the file: a setting is taken from the file
//! only when neither names it, and is then handed to the command line parser as its flag, so it
//! is checked exactly as the flag is and a bad value is refused with the flag's name.

use std::ffi::OsString;
use std::path::{Path, PathBuf};

use anyhow::{Context, bail};

/// The largest config file read.
const SETTINGS_BYTES_MAX: u64 = 256 * 1024;

/// The commands that read a config file, with their variable and default path.
const COMMANDS: [(&str, &str, &str); 2] = [
    ("agent", "FALLOW_AGENT_CONFIG", "/etc/fallow/agent.toml"),
    ("server", "FALLOW_SERVER_CONFIG", "/etc/fallow/server.toml"),
];

/// `argv` with the config file's settings added as flags, for `fallow agent` and `fallow
/// server` (`command` is the whole command line's definition); other commands' as given.
pub fn with_settings_file(argv: Vec<OsString>, command: &clap::Command) -> anyhow::Result<Vec<OsString>> {
    let Some(name) = argv.get(1).and_then(|arg| arg.to_str()) else {
        return Ok(argv);
    };
    let Some((name, variable, default)) = COMMANDS.iter().copied().find(|(known, _, _)| *known == name) else {
        return Ok(argv);
    };
    let given: Vec<String> = argv[2..].iter().map(|arg| arg.to_string_lossy().into_owned()).collect();
    let path = match config_flag(&given) {
        Some(path) => PathBuf::from(path),
        None => match std::env::var_os(variable).filter(|value| !value.is_empty()) {
            Some(path) => PathBuf::from(path),
            None if Path::new(default).is_file() => PathBuf::from(default),
            None => return Ok(argv),
        },
    };
    let text = read(&path)?;
    let Some(subcommand) = command.find_subcommand(name) else {
        return Ok(argv);
    };
    let flags = flags_from(&text, subcommand, &given)
        .with_context(|| format!("the config file {} of `fallow {name}`", path.display()))?;
    let mut out = argv[..2].to_vec();
    out.extend(flags.into_iter().map(OsString::from));
    out.extend(argv[2..].iter().cloned());
    Ok(out)
}

/// The path `--config PATH` or `--config=PATH` names among the arguments.
fn config_flag(given: &[String]) -> Option<String> {
    let mut args = given.iter();
    while let Some(arg) = args.next() {
        if arg == "--config" {
            return args.next().cloned();
        }
        if let Some(path) = arg.strip_prefix("--config=") {
            return Some(path.to_string());
        }
    }
    None
}

fn read(path: &Path) -> anyhow::Result<String> {
    let shown = path.display();
    let metadata = std::fs::metadata(path).with_context(|| format!("the config file {shown} cannot be read"))?;
    if metadata.len() > SETTINGS_BYTES_MAX {
        bail!("the config file {shown} is over {SETTINGS_BYTES_MAX} bytes");
    }
    std::fs::read_to_string(path).with_context(|| format!("the config file {shown} cannot be read"))
}

/// The flags the file's settings give that neither the command line (`given`) nor the
/// environment names, as `--name=value` (or `--name` for a switch set to true).
fn flags_from(text: &str, command: &clap::Command, given: &[String]) -> anyhow::Result<Vec<String>> {
    let mut flags = Vec::new();
    let mut seen: Vec<String> = Vec::new();
    for (number, key, rest) in crate::cli::config::settings(text, "setting = value")? {
        let long = key.replace('_', "-");
        let Some(arg) = command
            .get_arguments()
            .find(|arg| arg.get_long() == Some(long.as_str()) && long != "config")
        else {
            let known: Vec<&str> = command
                .get_arguments()
                .filter_map(clap::Arg::get_long)
                .filter(|long| !matches!(*long, "config" | "help" | "version"))
                .collect();
            bail!(
                "line {number}: unknown setting {key:?}; the settings are the flags: {}",
                known.join(", ")
            );
        };
        if seen.contains(&long) {
            bail!("line {number}: {long} is set twice");
        }
        seen.push(long.clone());
        let value = value_of(&rest).with_context(|| format!("line {number}: {long}"))?;
        let on_command_line = given
            .iter()
            .any(|arg| *arg == format!("--{long}") || arg.starts_with(&format!("--{long}=")));
        let in_environment = arg
            .get_env()
            .and_then(std::env::var_os)
            .is_some_and(|value| !value.is_empty());
        if on_command_line || in_environment {
            continue;
        }
        if arg.get_action().takes_values() {
            flags.push(format!("--{long}={value}"));
        } else {
            match value.as_str() {
                "true" => flags.push(format!("--{long}")),
                "false" => {}
                other => bail!("line {number}: {long} is a switch: true or false, not {other:?}"),
            }
        }
    }
    Ok(flags)
}

/// A value: a quoted string, or a bare number or boolean (a `#` comment may follow).
fn value_of(text: &str) -> anyhow::Result<String> {
    if text.starts_with('"') || text.starts_with('\'') {
        return crate::cli::config::parse_string(text);
    }
    let bare = text.split('#').next().unwrap_or("").trim();
    let number = !bare.is_empty()
        && bare
            .chars()
            .all(|c| c.is_ascii_digit() || matches!(c, '.' | '-' | '+' | '_' | 'e' | 'E'));
    if bare == "true" || bare == "false" || number {
        return Ok(bare.replace('_', ""));
    }
    bail!("{text:?} is not a quoted string, a number or true/false")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn command() -> clap::Command {
        clap::Command::new("agent")
            .arg(clap::Arg::new("region").long("region"))
            .arg(clap::Arg::new("gang_ports").long("gang-ports"))
            .arg(clap::Arg::new("thermal").long("thermal-limit-c"))
            .arg(
                clap::Arg::new("files")
                    .long("allow-file-datasets")
                    .action(clap::ArgAction::SetTrue),
            )
            .arg(
                clap::Arg::new("shm")
                    .long("shm-size")
                    .env("FALLOW_TEST_SETTINGS_SHM_SIZE"),
            )
    }

    #[test]
    fn settings_become_flags_unless_a_flag_or_the_environment_names_them() {
        let text = "# a comment\nregion = \"eu-west\"\ngang_ports = '29500-29599'  # fine\n\
                    thermal-limit-c = 83\nallow-file-datasets = true\nshm-size = \"1g\"\n";
        let flags = flags_from(text, &command(), &["--region".into(), "us-east".into()]).unwrap();
        assert_eq!(
            flags,
            vec![
                "--gang-ports=29500-29599",
                "--thermal-limit-c=83",
                "--allow-file-datasets",
                "--shm-size=1g"
            ]
        );
        let off = flags_from("allow-file-datasets = false", &command(), &[]).unwrap();
        assert!(off.is_empty());
    }

    #[test]
    fn bad_settings_say_which_line_and_what() {
        let error = |text: &str| format!("{:#}", flags_from(text, &command(), &[]).unwrap_err());
        assert!(error("regoin = \"x\"").contains("unknown setting \"regoin\""));
        assert!(error("regoin = \"x\"").contains("region, gang-ports"));
        assert!(error("region = eu-west").contains("line 1: region"));
        assert!(error("region = \"a\"\nregion = \"b\"").contains("line 2: region is set twice"));
        assert!(error("allow-file-datasets = 1").contains("a switch"));
        assert!(error("region").contains("expected `setting = value`"));
    }

    #[test]
    fn the_config_flag_is_found_in_either_form() {
        assert_eq!(
            config_flag(&["--config".into(), "a.toml".into()]).as_deref(),
            Some("a.toml")
        );
        assert_eq!(config_flag(&["--config=b.toml".into()]).as_deref(), Some("b.toml"));
        assert_eq!(config_flag(&["--region".into(), "x".into()]), None);
    }
}
