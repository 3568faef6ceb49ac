//! Running one gatewayctl command: the config is resolved, then the
//! command runs on a connected [`Ctl`] and writes to stdout and stderr.

use std::io::Write as _;
use std::process::ExitCode;

use crate::cli::{Cli, Command, ConfigCommand, DryRun, KeyChanges};
use crate::config::{self, default_path, ConfigFile};
use crate::output::{self, Format, PrintOptions};
use crate::{args, for_each, local, Ctl, CtlError, KeyMap};

pub async fn run(cli: Cli) -> Result<ExitCode, CtlError> {
    if let Command::Completion { shell } = &cli.command {
        crate::completion::registration(*shell, &mut std::io::stdout())?;
        return Ok(ExitCode::SUCCESS);
    }
    let config_path = cli.config.clone().unwrap_or_else(default_path);
    if cli.config.is_some() && !config_path.exists() {
        // A config named on purpose that is not there is a mistake, not an
        // empty config (only the default one may be absent).
        return Err(CtlError::Message(format!(
            "config file {} does not exist: check --config (GANTRY_CONFIG)",
            config_path.display()
        )));
    }
    let file = ConfigFile::load(&config_path).map_err(CtlError::Message)?;
    let (mut out, mut err) = (std::io::stdout().lock(), std::io::stderr().lock());
    match cli.command {
        Command::Config(command) => {
            config_cmd(command, file, &config_path, &mut out)?;
            return Ok(ExitCode::SUCCESS);
        }
        Command::Version { client: true } => {
            writeln!(out, "Client Version: {}", env!("CARGO_PKG_VERSION"))?;
            return Ok(ExitCode::SUCCESS);
        }
        _ => {}
    }
    let flags = config::Overrides {
        server: cli.server.clone(),
        token: cli.token.clone(),
        token_file: cli.token_file.clone(),
        ca: cli.ca.clone(),
        client_certificate: cli.client_certificate.clone(),
        client_key: cli.client_key.clone(),
        tls_server_name: cli.tls_server_name.clone(),
        context: cli.context.clone(),
    };
    let ctl = config::connect(&flags, &file, &config_path)?;
    dispatch(&ctl, cli.command, &mut out, &mut err).await
}

/// Runs one command that talks to the store.
pub async fn dispatch(
    ctl: &Ctl,
    command: Command,
    out: &mut impl std::io::Write,
    err: &mut impl std::io::Write,
) -> Result<ExitCode, CtlError> {
    match command {
        Command::Apply { files, recursive, force_conflicts, dry_run } => {
            for_each(
                local::documents(&files, recursive),
                |doc| match doc {
                    Ok(doc) => format!("gateway/{}", doc.metadata.name),
                    Err((path, _)) => path.clone(),
                },
                async |doc| match doc {
                    Ok(doc) => ctl.apply(doc, dry_run.server()?, force_conflicts).await,
                    Err((_, e)) => Err(CtlError::Message(e.to_string())),
                },
                out,
                err,
            )
            .await?;
        }
        Command::Create { flags, output, dry_run } => {
            create(ctl, flags, output, dry_run, out).await?
        }
        Command::Get { names, selector, output, no_headers, show_labels, sort_by, watch } => {
            let options = PrintOptions {
                single: false,
                headers: !no_headers,
                show_labels,
                sort_by,
                revision: 0,
            };
            let revision = ctl.get_cmd(&names, &selector, &output, &options, out, err).await?;
            if watch {
                ctl.get_watch(&names, &selector, &output, &options, revision, out).await?;
            }
        }
        Command::Describe { name } => ctl.describe(&name, out).await?,
        Command::Diff { files, recursive } => {
            // As `kubectl diff`: 0 no change, 1 changes, anything above an
            // error (never 1, which would read as "changes").
            return Ok(match local::diff(ctl, &files, recursive, err).await {
                Ok(code) => code,
                Err(CtlError::Reported) => ExitCode::from(2),
                Err(e) => {
                    writeln!(err, "error: {e}")?;
                    ExitCode::from(2)
                }
            });
        }
        Command::Edit { name } => local::edit(ctl, &name, out, err).await?,
        Command::Label(keys) => writeln!(out, "{}", set_keys(ctl, KeyMap::Labels, keys).await?)?,
        Command::Annotate(keys) => {
            writeln!(out, "{}", set_keys(ctl, KeyMap::Annotations, keys).await?)?;
        }
        Command::Patch { name, patch, kind, dry_run } => {
            writeln!(out, "{}", ctl.patch(&name, kind, &patch, dry_run.server()?).await?)?;
        }
        Command::Scale { name, replicas, current_replicas, dry_run } => {
            let done = ctl.scale(&name, replicas, current_replicas, dry_run.server()?);
            writeln!(out, "{}", done.await?)?;
        }
        Command::Delete { names, selector, all, files, wait, timeout, dry_run } => {
            let names = which(ctl, names, selector, all, &files, err).await?;
            ctl.delete_all(&names, wait.then_some(timeout), dry_run.server()?, out, err).await?;
        }
        Command::Wait { names, condition, timeout } => {
            ctl.wait(&names, &condition, timeout, out).await?;
        }
        Command::Retry { name } => ctl.retry(&name, out).await?,
        Command::Watch { selector, name } => ctl.watch(&selector, name.as_deref(), out).await?,
        Command::Version { .. } => {
            writeln!(out, "Client Version: {}", env!("CARGO_PKG_VERSION"))?;
            writeln!(out, "Server Version: {}", ctl.server_version().await?)?;
        }
        Command::Config(_) | Command::Completion { .. } => {}
    }
    Ok(ExitCode::SUCCESS)
}

/// `config ...`: reads or changes the config file at `path`.
fn config_cmd(
    command: ConfigCommand,
    file: ConfigFile,
    path: &std::path::Path,
    out: &mut impl std::io::Write,
) -> Result<(), CtlError> {
    match command {
        ConfigCommand::GetContexts => config::get_contexts(&file, out),
        ConfigCommand::UseContext { name } => config::use_context(file, path, &name, out),
        ConfigCommand::CurrentContext => config::current_context(&file, path, out),
        ConfigCommand::View { raw } => config::view(&file, raw, out),
        ConfigCommand::SetContext { name, change } => {
            let name = match (name, change.current) {
                (Some(name), _) => name,
                (None, true) if !file.current_context.is_empty() => file.current_context.clone(),
                _ => {
                    return Err(CtlError::Message(
                        "name the context (or use --current with a current context)".into(),
                    ))
                }
            };
            config::set_context(file, path, &name, change, out)
        }
    }
}

/// `create`: from flags; with `--dry-run=client` nothing is sent; with
/// `-o` the gateway made is printed instead of a line.
async fn create(
    ctl: &Ctl,
    flags: args::CreateFlags,
    output: Option<String>,
    dry_run: crate::cli::DryRunArg,
    out: &mut impl std::io::Write,
) -> Result<(), CtlError> {
    let doc = args::create_doc(flags)?;
    let made = match dry_run.mode {
        DryRun::Client => doc.to_proto(),
        _ => ctl.create(&doc, dry_run.server()?).await?,
    };
    match output {
        Some(format) => {
            let format = Format::parse(&format).map_err(CtlError::Message)?;
            let single = PrintOptions { single: true, ..Default::default() };
            output::print(&[made], &format, &single, out)?;
        }
        None => {
            let note = match dry_run.mode {
                DryRun::Client => " (dry run)",
                DryRun::Server => " (server dry run)",
                DryRun::None => "",
            };
            writeln!(out, "gateway/{} created{note}", doc.metadata.name)?;
        }
    }
    Ok(())
}

/// The gateways `delete` names: by name, selector, file or all (exactly
/// one of the ways).
async fn which(
    ctl: &Ctl,
    names: Vec<String>,
    selector: Option<String>,
    all: bool,
    files: &[String],
    err: &mut impl std::io::Write,
) -> Result<Vec<String>, CtlError> {
    let ways = [!names.is_empty(), selector.is_some(), all, !files.is_empty()];
    if ways.iter().filter(|w| **w).count() != 1 {
        return Err(CtlError::Message(
            "say which gateways: NAME..., -l SELECTOR, -f FILE or --all (one of them)".into(),
        ));
    }
    match (selector, all) {
        (Some(selector), _) => ctl.names(&selector).await,
        (None, true) => ctl.names("").await,
        _ if !files.is_empty() => local::names_in(files, err),
        _ => Ok(names),
    }
}

/// `label` and `annotate`.
async fn set_keys(ctl: &Ctl, map: KeyMap, keys: KeyChanges) -> Result<String, CtlError> {
    let KeyChanges { name, changes, overwrite, dry_run } = keys;
    ctl.set_keys(&name, map, &changes, overwrite, dry_run.server()?).await
}
