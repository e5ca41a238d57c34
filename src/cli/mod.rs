//! What the two bundled binaries (`pulpitum`, `pulpitum-archiver`) share beyond the
//! library: the `migrate` command, the exit status of a refused setting, standard output
//! that ends the process the conventional way when its reader goes away, and the shell's
//! script splitting ([`script`]).
//!
//! `pulpitum migrate` and `pulpitum-archiver migrate` are one function, [`migrate`], so an
//! operator may run whichever binary the deployment has. Writing to a closed pipe
//! (`pulpitum -c ... | head -1`) must neither panic nor print an error: the process dies of
//! SIGPIPE, as `cat` or `grep` do (status 141 in a shell), after the statement that was
//! printing has finished; nothing half-done is left behind that a crash would not leave.

use std::io::Write;

pub mod erasure;
pub mod script;
pub mod serve;
pub mod shell;
pub mod worker;

use crate::store::migrate::Migrated;
use crate::store::StoreError;

/// The exit status of a setting refused before any work (an invalid `PULPITUM_LOG` or
/// `--log-format`, a bad archiver setting, a flag the subcommand would ignore, an archive URL
/// or hot store that cannot be opened), in both binaries: 2, as clap exits for a flag it
/// refuses. A failure in the work itself (a statement, a failed bucket) exits 1.
pub const EXIT_SETTING: u8 = 2;

/// `--database-url`'s help, one text for both binaries: each accepts every form the store
/// opens, so each help lists them all.
pub const DATABASE_URL_HELP: &str = "Hot store: postgres://..., postgresql://..., a PostgreSQL key=value string (host=... dbname=...), sqlite:PATH, sqlite://PATH, sqlite::memory: or a file path containing '/' or ending in .db, .sqlite or .sqlite3 (an existing file; `migrate` creates one). Default: the embedded store in ./pulpitum-data.";

/// `--archive-url`'s help, one text for both binaries.
pub const ARCHIVE_URL_HELP: &str = "Archive URL: s3://bucket/prefix, file:///absolute/path or memory://. Give both URLs or neither; neither: the embedded default, ./pulpitum-data/archive.";

/// Why `migrate` failed.
#[derive(Debug, thiserror::Error)]
pub enum CliError {
    /// The URLs could not be settled.
    #[error(transparent)]
    Defaults(#[from] crate::defaults::DefaultsError),
    /// The store refused or failed.
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// `migrate`: opens the hot store named by `database_url` (none: the embedded default under
/// `./pulpitum-data`), creating an embedded file if it does not exist, and applies this
/// build's pending migrations. The archive is not touched, so no archive URL is needed;
/// `archive_url` only keeps the rule that the embedded default is taken when neither URL is
/// given. Returns the line to print.
pub async fn migrate(
    database_url: Option<&str>,
    archive_url: Option<&str>,
) -> Result<String, CliError> {
    let url = match database_url {
        Some(u) => u.to_string(),
        None => crate::defaults::resolve_urls(None, archive_url)?.0,
    };
    let Migrated { applied, version } = crate::store::open(&url).await?.migrate().await?;
    let shown = crate::locator::redact(&url);
    Ok(if applied.is_empty() {
        format!("{shown}: the schema is at version {version}, this build's; nothing to apply")
    } else {
        let list = applied
            .iter()
            .map(i64::to_string)
            .collect::<Vec<_>>()
            .join(", ");
        format!(
            "{shown}: applied migration{} {list}; the schema is at version {version}",
            if applied.len() == 1 { "" } else { "s" }
        )
    })
}

/// The flags of `cmd` given on the command line (not taken from the environment or a
/// default) other than `allowed` (argument ids): what a subcommand that does not use them
/// refuses, rather than ignoring what the user typed. Returned as `--flag` names.
pub fn flags_given(
    cmd: &clap::Command,
    matches: &clap::ArgMatches,
    allowed: &[&str],
) -> Vec<String> {
    cmd.get_arguments()
        .filter(|a| !allowed.contains(&a.get_id().as_str()))
        .filter(|a| {
            matches.value_source(a.get_id().as_str())
                == Some(clap::parser::ValueSource::CommandLine)
        })
        .map(|a| match a.get_long() {
            Some(long) => format!("--{long}"),
            None => a.get_id().to_string(),
        })
        .collect()
}

/// `cmd` with the global flags `ids` hidden from the help of the subcommands `subs` and of
/// theirs: a subcommand refuses the global flags it would ignore (see [`flags_given`]), so
/// its help must not offer them. A subcommand gets a hidden copy of each flag; clap copies a
/// global flag into a subcommand only where none of that name exists, and the copy, global
/// too, passes on to the subcommand's own subcommands. Parsing still accepts the flags, so
/// the refusal, not clap, answers them wherever they are typed.
pub fn hide_globals_in(mut cmd: clap::Command, subs: &[&str], ids: &[&str]) -> clap::Command {
    let hidden: Vec<clap::Arg> = cmd
        .get_arguments()
        .filter(|a| ids.contains(&a.get_id().as_str()))
        .map(|a| a.clone().hide(true))
        .collect();
    for sub in subs {
        cmd = cmd.mut_subcommand(sub, |s| s.args(hidden.clone()));
    }
    cmd
}

/// Standard output that ends the process by SIGPIPE when the reader has gone (see
/// [`end_of_pipe`]); any other error is returned to the caller.
pub struct Stdout(std::io::StdoutLock<'static>);

/// Locks standard output behind [`Stdout`].
pub fn stdout() -> Stdout {
    Stdout(std::io::stdout().lock())
}

fn pipe_checked<T>(r: std::io::Result<T>) -> std::io::Result<T> {
    match r {
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => end_of_pipe(),
        other => other,
    }
}

impl Write for Stdout {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        pipe_checked(self.0.write(buf))
    }

    fn flush(&mut self) -> std::io::Result<()> {
        pipe_checked(self.0.flush())
    }
}

impl Drop for Stdout {
    fn drop(&mut self) {
        // The lock's buffer is written out here, so a closed pipe is noticed here too.
        let _ = pipe_checked(self.0.flush());
    }
}

/// Ends the process as a writer to a closed pipe conventionally ends: killed by SIGPIPE,
/// printing nothing. The Rust runtime ignores SIGPIPE (so that sockets report EPIPE as an
/// error), which is why a broken pipe shows up as an error to turn into this.
pub fn end_of_pipe() -> ! {
    #[cfg(unix)]
    // SAFETY: restoring the default action of one signal and raising it on this thread;
    // neither call touches memory, and the default action ends the process.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
        libc::raise(libc::SIGPIPE);
    }
    std::process::exit(141)
}

/// Installs a panic hook that turns the panic of `println!`/`eprintln!` on a closed pipe
/// (the standard library panics there) into [`end_of_pipe`], and leaves every other panic
/// to the default hook. The binaries write through [`stdout`]; this covers what is left.
pub fn quiet_broken_pipes() {
    let default = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let text = info
            .payload()
            .downcast_ref::<String>()
            .map(String::as_str)
            .or_else(|| info.payload().downcast_ref::<&str>().copied())
            .unwrap_or("");
        if text.starts_with("failed printing to std") && text.contains("Broken pipe") {
            end_of_pipe();
        }
        default(info);
    }));
}

/// The flags among `ids` (clap ids) typed on the command line, before or after the
/// subcommand, as `--flag` names: a subcommand refuses those it would ignore.
pub fn typed_flags(
    matches: &clap::ArgMatches,
    sub: &clap::ArgMatches,
    ids: &[&str],
) -> Vec<String> {
    use clap::parser::ValueSource;
    ids.iter()
        .filter(|id| {
            [matches, sub]
                .iter()
                .any(|m| m.value_source(id) == Some(ValueSource::CommandLine))
        })
        .map(|id| format!("--{}", id.replace('_', "-")))
        .collect()
}
