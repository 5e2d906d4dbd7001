//! `fallow completions SHELL`: a completion script for bash, zsh, fish, elvish or PowerShell.

use clap::{Args, CommandFactory};
use clap_complete::Shell;

#[derive(Args)]
pub struct CompletionsArgs {
    /// The shell, e.g. `fallow completions bash > ~/.local/share/bash-completion/completions/fallow`.
    shell: Shell,
}

pub fn run(args: CompletionsArgs) -> anyhow::Result<()> {
    super::die_quietly_on_closed_stdout();
    let mut command = crate::Cli::command();
    clap_complete::generate(args.shell, &mut command, "fallow", &mut std::io::stdout());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cli_definition_is_consistent() {
        crate::Cli::command().debug_assert();
    }
}
