//! A replica's scratch directory on an encrypted volume, so that nothing a tenant wrote is
//! readable on the host after its lease: gocryptfs over FUSE, with a password made for the lease
//! from the OS's random source, handed to gocryptfs through a pipe and never written anywhere.
//! At the lease's end the volume is unmounted and its cipher directory removed. If the agent
//! dies first, its volumes stay mounted (gocryptfs's daemon holds their master keys) until the
//! agent starts again, which unmounts and removes them, or the host restarts; their cipher
//! files alone are unreadable, since the passwords died with the agent's memory.
//!
//! Where gocryptfs or FUSE is missing, `--scratch-encryption auto` runs replicas in plain
//! directories (removed at the lease's end as before) and says so once at start;
//! `--scratch-encryption gocryptfs` refuses to start instead.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use tokio::io::AsyncWriteExt;
use zeroize::Zeroizing;

/// How long gocryptfs may take to make or mount a volume (the key derivation is cheap: see
/// `SCRYPT_LOG2_N`).
const GOCRYPTFS_TIMEOUT: Duration = Duration::from_secs(30);
/// How long an unmount may take.
const UNMOUNT_TIMEOUT: Duration = Duration::from_secs(10);
/// The password is 256 random bits, so gocryptfs's scrypt need not be slow to make guessing
/// it hard: its cheapest cost (2^10) keeps a lease's start fast and its memory small.
const SCRYPT_LOG2_N: &str = "10";
/// The password's length in bytes.
pub const KEY_BYTES: usize = 32;
/// The file system type of a gocryptfs mount in /proc/self/mountinfo.
const FS_TYPE: &str = "fuse.gocryptfs";
/// The kernel's FUSE device, which gocryptfs needs to mount.
const FUSE_DEVICE: &str = "/dev/fuse";

/// How a replica's scratch directory is kept (`fallow agent --scratch-encryption`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ScratchEncryption {
    /// gocryptfs where it and FUSE are available; plain directories elsewhere, said once.
    #[default]
    Auto,
    /// gocryptfs, or the agent does not start.
    Gocryptfs,
    /// Plain directories, removed at the lease's end.
    Off,
}

#[derive(Debug, thiserror::Error)]
pub enum ScratchError {
    /// Encryption was required and cannot be had on this host.
    #[error(
        "--scratch-encryption gocryptfs: {0} (install gocryptfs and fuse3, e.g. `apt-get install gocryptfs fuse3`, or choose auto or off)"
    )]
    Unavailable(String),
    #[error("the replica's encrypted scratch at {path}: {detail}")]
    Volume { path: PathBuf, detail: String },
}

/// A lease's password: 32 bytes from the OS's random source, overwritten when dropped.
struct LeaseKey(Zeroizing<[u8; KEY_BYTES]>);

impl LeaseKey {
    fn generate() -> LeaseKey {
        let mut key = Zeroizing::new([0u8; KEY_BYTES]);
        getrandom::fill(key.as_mut()).expect("the operating system's random source is available");
        LeaseKey(key)
    }

    /// The password as gocryptfs reads it from a pipe: hex and a newline (it takes a line).
    fn password_line(&self) -> Zeroizing<Vec<u8>> {
        let mut line = Zeroizing::new(vec![0u8; KEY_BYTES * 2 + 1]);
        hex::encode_to_slice(self.0.as_ref(), &mut line[..KEY_BYTES * 2])
            .expect("the buffer is twice the key's length");
        line[KEY_BYTES * 2] = b'\n';
        line
    }
}

/// The tools an encrypted scratch needs, found on this host.
#[derive(Clone, Debug)]
struct Tools {
    gocryptfs: PathBuf,
    fusermount: PathBuf,
}

/// How this agent keeps replicas' scratch directories: encrypted (with the tools to do it) or
/// plain. Cheap to clone.
#[derive(Clone, Debug)]
pub struct Scratch {
    tools: Option<Tools>,
}

impl Scratch {
    /// Plain directories.
    pub fn plain() -> Scratch {
        Scratch { tools: None }
    }

    /// What `mode` comes to on this host: for `Auto`, plain directories (with a warning) where
    /// gocryptfs or FUSE is missing; for `Gocryptfs`, an error saying what is missing.
    pub fn resolve(mode: ScratchEncryption) -> Result<Scratch, ScratchError> {
        resolve_on(mode, std::env::var_os("PATH"), Path::new(FUSE_DEVICE))
    }

    /// Whether scratch directories are encrypted volumes.
    pub fn encrypted(&self) -> bool {
        self.tools.is_some()
    }

    /// Makes the scratch directory `scratch_dir` for a replica: plain, or an encrypted volume
    /// mounted there with a new key (whose cipher directory is `cipher_dir_of(scratch_dir)`).
    /// Already mounted (a gang replica's, opened before its rendezvous is written): as it is.
    pub async fn open(&self, scratch_dir: &Path) -> Result<(), ScratchError> {
        let Some(tools) = &self.tools else {
            return tokio::fs::create_dir_all(scratch_dir)
                .await
                .map_err(|error| ScratchError::Volume {
                    path: scratch_dir.to_path_buf(),
                    detail: error.to_string(),
                });
        };
        if is_mounted(scratch_dir) {
            return Ok(());
        }
        let key = LeaseKey::generate();
        mount(tools, scratch_dir, &key).await
    }

    /// Removes the scratch directory `scratch_dir` after its replica is gone: unmounts its
    /// volume (lazily when something still holds it), then removes the mount point and the
    /// cipher directory. Failures are logged: the volume's key is gone either way.
    pub async fn close(&self, scratch_dir: &Path) {
        if is_mounted(scratch_dir) {
            let fusermount = self
                .tools
                .as_ref()
                .map_or_else(|| PathBuf::from("fusermount"), |tools| tools.fusermount.clone());
            unmount(&fusermount, scratch_dir).await;
        }
        for dir in [scratch_dir.to_path_buf(), cipher_dir_of(scratch_dir)] {
            match tokio::fs::remove_dir_all(&dir).await {
                Ok(()) => {}
                Err(error) if error.kind() == std::io::ErrorKind::NotFound => {}
                Err(error) => tracing::warn!(path = %dir.display(), %error, "could not remove a replica's scratch"),
            }
        }
        let _ = tokio::fs::remove_file(log_of(scratch_dir)).await;
    }

    /// Unmounts and removes the scratch volumes an earlier run of the agent left under
    /// `leases_dir` (one directory per lease): their keys died with it, so what they hold is
    /// unreadable; this frees the space and the mounts.
    pub async fn clean_stale(&self, leases_dir: &Path) {
        let Ok(mut entries) = tokio::fs::read_dir(leases_dir).await else {
            return;
        };
        let mut stale = Vec::new();
        while let Ok(Some(entry)) = entries.next_entry().await {
            let scratch_dir = entry.path().join(SCRATCH_DIR);
            if is_mounted(&scratch_dir) || cipher_dir_of(&scratch_dir).exists() {
                stale.push(scratch_dir);
            }
        }
        stale.sort();
        for scratch_dir in stale {
            tracing::warn!(path = %scratch_dir.display(), "removing a replica's encrypted scratch left by an earlier run of the agent");
            self.close(&scratch_dir).await;
        }
    }
}

/// The name of a replica's scratch directory inside its lease's directory.
pub const SCRATCH_DIR: &str = "scratch";

/// Where the encrypted volume mounted at `scratch_dir` keeps its files: `scratch.enc` beside it.
pub fn cipher_dir_of(scratch_dir: &Path) -> PathBuf {
    let mut name = scratch_dir.file_name().unwrap_or_default().to_os_string();
    name.push(".enc");
    scratch_dir.with_file_name(name)
}

/// gocryptfs's messages for the volume at `scratch_dir` (never its password): a file beside it,
/// since the daemon outlives the command that mounts it and would die writing to a closed pipe.
fn log_of(scratch_dir: &Path) -> PathBuf {
    let mut name = scratch_dir.file_name().unwrap_or_default().to_os_string();
    name.push(".gocryptfs.log");
    scratch_dir.with_file_name(name)
}

/// `Scratch::resolve` with the program search path and the FUSE device given.
fn resolve_on(mode: ScratchEncryption, path: Option<std::ffi::OsString>, fuse: &Path) -> Result<Scratch, ScratchError> {
    if mode == ScratchEncryption::Off {
        return Ok(Scratch::plain());
    }
    match find_tools(path, fuse) {
        Ok(tools) => {
            tracing::info!(gocryptfs = %tools.gocryptfs.display(), "replicas' scratch directories are encrypted (gocryptfs), with a key per lease");
            Ok(Scratch { tools: Some(tools) })
        }
        Err(missing) if mode == ScratchEncryption::Auto => {
            tracing::warn!(
                %missing,
                "replicas' scratch directories are NOT encrypted: what a tenant writes there stays on this host's disk until removed at the lease's end (install gocryptfs and fuse3, or start with --scratch-encryption off to silence this)"
            );
            Ok(Scratch::plain())
        }
        Err(missing) => Err(ScratchError::Unavailable(missing)),
    }
}

/// gocryptfs and fusermount on `path`, and a usable FUSE device; or what is missing.
fn find_tools(path: Option<std::ffi::OsString>, fuse: &Path) -> Result<Tools, String> {
    let gocryptfs = on_path(path.as_ref(), "gocryptfs").ok_or("gocryptfs is not on PATH")?;
    let fusermount = on_path(path.as_ref(), "fusermount3")
        .or_else(|| on_path(path.as_ref(), "fusermount"))
        .ok_or("neither fusermount3 nor fusermount is on PATH (fuse3)")?;
    std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(fuse)
        .map_err(|error| format!("{} cannot be opened: {error}", fuse.display()))?;
    // SAFETY: geteuid(2) reads the process's effective user id; no memory is involved.
    let root = unsafe { libc::geteuid() } == 0;
    let allowed = std::fs::read_to_string(FUSE_CONF).is_ok_and(|text| user_allow_other(&text));
    if !root && !allowed {
        // A FUSE volume mounted without allow_other is closed even to root: the Docker daemon
        // could not mount it into a replica's container.
        return Err(format!(
            "the agent is not root and {FUSE_CONF} lacks user_allow_other, so Docker could not reach an encrypted scratch (add the line user_allow_other there)"
        ));
    }
    Ok(Tools { gocryptfs, fusermount })
}

/// FUSE's settings, where `user_allow_other` lets users other than root mount with allow_other.
const FUSE_CONF: &str = "/etc/fuse.conf";

/// Whether fuse.conf's text enables `user_allow_other` (a line of its own, not commented out).
fn user_allow_other(text: &str) -> bool {
    text.lines().any(|line| line.trim() == "user_allow_other")
}

fn on_path(path: Option<&std::ffi::OsString>, program: &str) -> Option<PathBuf> {
    std::env::split_paths(path?)
        .map(|dir| dir.join(program))
        .find(|candidate| candidate.is_file())
}

/// Makes a new gocryptfs volume keyed by `key` and mounts it at `scratch_dir`.
async fn mount(tools: &Tools, scratch_dir: &Path, key: &LeaseKey) -> Result<(), ScratchError> {
    let failed = |detail: String| ScratchError::Volume {
        path: scratch_dir.to_path_buf(),
        detail,
    };
    let cipher_dir = cipher_dir_of(scratch_dir);
    // A volume left by an earlier run of this lease's replica is unreadable: begin afresh.
    match tokio::fs::remove_dir_all(&cipher_dir).await {
        Ok(()) => {}
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => {}
        Err(error) => return Err(failed(format!("{}: {error}", cipher_dir.display()))),
    }
    let _ = tokio::fs::remove_dir_all(scratch_dir).await;
    for dir in [&cipher_dir, &scratch_dir.to_path_buf()] {
        tokio::fs::create_dir_all(dir)
            .await
            .map_err(|error| failed(format!("{}: {error}", dir.display())))?;
    }
    let mut init = tokio::process::Command::new(&tools.gocryptfs);
    init.args(["-init", "-q", "-scryptn", SCRYPT_LOG2_N, "--"])
        .arg(&cipher_dir);
    run_with_password(init, key, None)
        .await
        .map_err(|detail| failed(format!("gocryptfs -init: {detail}")))?;
    let log_path = log_of(scratch_dir);
    let log = std::fs::File::create(&log_path).map_err(|error| failed(format!("{}: {error}", log_path.display())))?;
    let mut mount = tokio::process::Command::new(&tools.gocryptfs);
    mount.args(["-q", "-nosyslog"]);
    // Docker mounts the scratch into containers that may run as another user: allowed for them
    // (with the usual permission checks); `find_tools` made sure this agent may ask for it.
    mount.arg("-allow_other");
    mount.arg("--").arg(&cipher_dir).arg(scratch_dir);
    run_with_password(mount, key, Some(log))
        .await
        .map_err(|detail| failed(format!("mounting with gocryptfs: {detail}")))?;
    if !is_mounted(scratch_dir) {
        return Err(failed(
            "gocryptfs said it mounted the volume, but it is not mounted".into(),
        ));
    }
    Ok(())
}

/// Runs gocryptfs with `key`'s password on its stdin (it reads it from there when stdin is not
/// a terminal), so the password is on no command line, in no environment and in no file. Its
/// messages go to `log` (a mount's daemon keeps writing there), else are read from a pipe.
async fn run_with_password(
    mut command: tokio::process::Command,
    key: &LeaseKey,
    log: Option<std::fs::File>,
) -> Result<(), String> {
    let log_path_given = log.is_some();
    command.stdin(Stdio::piped()).stdout(Stdio::null()).kill_on_drop(true);
    match log {
        Some(file) => command.stderr(file),
        None => command.stderr(Stdio::piped()),
    };
    let mut child = command.spawn().map_err(|error| error.to_string())?;
    let mut stdin = child.stdin.take().expect("stdin is piped");
    let password = key.password_line();
    stdin
        .write_all(&password)
        .await
        .map_err(|error| format!("handing over the password: {error}"))?;
    drop(stdin);
    let mut stderr = child.stderr.take();
    let status = match tokio::time::timeout(GOCRYPTFS_TIMEOUT, child.wait()).await {
        Ok(status) => status.map_err(|error| error.to_string())?,
        Err(_) => return Err(format!("no answer within {} s", GOCRYPTFS_TIMEOUT.as_secs())),
    };
    if status.success() {
        return Ok(());
    }
    let mut said = String::new();
    if let Some(stderr) = stderr.as_mut() {
        use tokio::io::AsyncReadExt;
        let _ = tokio::time::timeout(Duration::from_secs(2), stderr.read_to_string(&mut said)).await;
    }
    let said = said.trim();
    Err(match (said.is_empty(), log_path_given) {
        (false, _) => format!("{status}: {said}"),
        (true, true) => format!("{status} (its messages are in the log beside the scratch directory)"),
        (true, false) => status.to_string(),
    })
}

/// Unmounts the FUSE volume at `mount_point`; lazily (detached now, gone once nothing holds it)
/// when it is busy.
async fn unmount(fusermount: &Path, mount_point: &Path) {
    for flags in [&["-u", "-q"][..], &["-u", "-z", "-q"][..]] {
        let run = tokio::process::Command::new(fusermount)
            .args(flags)
            .arg(mount_point)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .output();
        match tokio::time::timeout(UNMOUNT_TIMEOUT, run).await {
            Ok(Ok(output)) if output.status.success() => return,
            Ok(Ok(output)) => tracing::warn!(
                path = %mount_point.display(),
                flags = flags.join(" "),
                said = %String::from_utf8_lossy(&output.stderr).trim(),
                "could not unmount a replica's encrypted scratch"
            ),
            Ok(Err(error)) => tracing::warn!(path = %mount_point.display(), %error, "could not run fusermount"),
            Err(_) => tracing::warn!(path = %mount_point.display(), "fusermount did not answer"),
        }
    }
}

/// Whether a gocryptfs volume is mounted at `path` (by /proc/self/mountinfo).
pub fn is_mounted(path: &Path) -> bool {
    let Ok(info) = std::fs::read_to_string("/proc/self/mountinfo") else {
        return false;
    };
    // The parent, not the mount point: a volume whose daemon died cannot be looked at.
    let wanted = match (path.parent().map(std::fs::canonicalize), path.file_name()) {
        (Some(Ok(parent)), Some(name)) => parent.join(name),
        _ => path.to_path_buf(),
    };
    gocryptfs_mounts(&info).contains(&wanted)
}

/// The mount points of gocryptfs volumes in a mountinfo text (proc(5)): the fifth field, with
/// its octal escapes undone, of each line whose type (after the ` - `) is `fuse.gocryptfs`.
pub fn gocryptfs_mounts(mountinfo: &str) -> Vec<PathBuf> {
    mountinfo
        .lines()
        .filter_map(|line| {
            let (mount, rest) = line.split_once(" - ")?;
            let fs_type = rest.split(' ').next()?;
            (fs_type == FS_TYPE).then(|| mount.split(' ').nth(4).map(unescape))?
        })
        .collect()
}

/// Undoes mountinfo's octal escapes (`\040` for a space, `\011`, `\012`, `\134`).
fn unescape(field: &str) -> PathBuf {
    use std::os::unix::ffi::OsStringExt;
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut at = 0;
    while at < bytes.len() {
        if bytes[at] == b'\\'
            && let Some(digits) = bytes.get(at + 1..at + 4)
            && digits.iter().all(|digit| (b'0'..=b'7').contains(digit))
        {
            out.push(
                digits
                    .iter()
                    .fold(0u8, |value, digit| value.wrapping_mul(8) + (digit - b'0')),
            );
            at += 4;
        } else {
            out.push(bytes[at]);
            at += 1;
        }
    }
    PathBuf::from(std::ffi::OsString::from_vec(out))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mount_points_are_read_from_mountinfo_with_their_escapes() {
        let info = "\
36 35 98:0 / /mnt/plain rw,noatime master:1 - ext3 /dev/root rw,errors=continue
91 29 0:52 / /var/lib/fallow/leases/7/scratch rw,nosuid,nodev,relatime shared:1 - fuse.gocryptfs /var/lib/fallow/leases/7/scratch.enc rw,user_id=0
92 29 0:53 / /tmp/a\\040b/scratch rw - fuse.gocryptfs /tmp/a\\040b/scratch.enc rw
93 29 0:54 / /tmp/other rw - fuse.sshfs host:/ rw";
        assert_eq!(
            gocryptfs_mounts(info),
            vec![
                PathBuf::from("/var/lib/fallow/leases/7/scratch"),
                PathBuf::from("/tmp/a b/scratch")
            ]
        );
        assert!(gocryptfs_mounts("garbage\n\n - \n1 2 3 - fuse.gocryptfs").is_empty());
    }

    #[test]
    fn user_allow_other_counts_only_uncommented() {
        assert!(user_allow_other("# comment\nuser_allow_other\n"));
        assert!(user_allow_other("  user_allow_other  "));
        assert!(!user_allow_other("#user_allow_other\n"));
        assert!(!user_allow_other("mount_max = 1000\n"));
        assert!(!user_allow_other(""));
    }

    #[test]
    fn the_cipher_directory_and_log_sit_beside_the_scratch_directory() {
        let scratch = Path::new("/data/leases/12/scratch");
        assert_eq!(cipher_dir_of(scratch), Path::new("/data/leases/12/scratch.enc"));
        assert_eq!(log_of(scratch), Path::new("/data/leases/12/scratch.gocryptfs.log"));
    }

    /// Whether a missing tool must fail the test (`FALLOW_CI_REQUIRE_SERVICES=1`, set by CI).
    fn required() -> bool {
        std::env::var("FALLOW_CI_REQUIRE_SERVICES").is_ok_and(|value| value == "1")
    }

    #[test]
    fn without_gocryptfs_auto_falls_back_to_plain_directories_and_gocryptfs_refuses() {
        let nowhere = Some(std::ffi::OsString::from("/nonexistent-fallow-bin"));
        let fuse = Path::new(FUSE_DEVICE);
        let auto = resolve_on(ScratchEncryption::Auto, nowhere.clone(), fuse).expect("auto always starts");
        assert!(!auto.encrypted(), "plain directories without gocryptfs");
        let refused = resolve_on(ScratchEncryption::Gocryptfs, nowhere, fuse)
            .expect_err("gocryptfs refuses to start without gocryptfs")
            .to_string();
        assert!(
            refused.contains("gocryptfs is not on PATH") && refused.contains("apt-get install gocryptfs fuse3"),
            "{refused}"
        );
        let off = resolve_on(ScratchEncryption::Off, std::env::var_os("PATH"), fuse).unwrap();
        assert!(!off.encrypted(), "off is off even where gocryptfs is");
        // gocryptfs present, FUSE not: refused too, naming the device.
        if let Ok(tools) = find_tools(std::env::var_os("PATH"), fuse) {
            let _ = tools;
            let no_fuse = resolve_on(
                ScratchEncryption::Gocryptfs,
                std::env::var_os("PATH"),
                Path::new("/nonexistent-fallow-fuse"),
            )
            .expect_err("no FUSE device")
            .to_string();
            assert!(
                no_fuse.contains("/nonexistent-fallow-fuse cannot be opened"),
                "{no_fuse}"
            );
        }
    }

    /// Every file under `dir` (not following links), with its bytes.
    fn files_under(dir: &Path) -> Vec<(PathBuf, Vec<u8>)> {
        let mut found = Vec::new();
        let mut pending = vec![dir.to_path_buf()];
        while let Some(next) = pending.pop() {
            let Ok(entries) = std::fs::read_dir(&next) else {
                continue;
            };
            for entry in entries.flatten() {
                let path = entry.path();
                match entry.file_type() {
                    Ok(kind) if kind.is_dir() => pending.push(path),
                    Ok(kind) if kind.is_file() => {
                        let bytes = std::fs::read(&path).unwrap_or_else(|error| panic!("{}: {error}", path.display()));
                        found.push((path, bytes));
                    }
                    _ => {}
                }
            }
        }
        found
    }

    fn contains(haystack: &[u8], needle: &[u8]) -> bool {
        haystack.windows(needle.len()).any(|window| window == needle)
    }

    /// The processes whose command line mentions `text`: (pid, command line, environment).
    fn processes_naming(text: &str) -> Vec<(u32, Vec<u8>, Vec<u8>)> {
        let mut found = Vec::new();
        for entry in std::fs::read_dir("/proc").unwrap().flatten() {
            let Some(pid) = entry.file_name().to_str().and_then(|name| name.parse::<u32>().ok()) else {
                continue;
            };
            let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) else {
                continue;
            };
            if contains(&cmdline, text.as_bytes()) {
                let environ = std::fs::read(entry.path().join("environ")).unwrap_or_default();
                found.push((pid, cmdline, environ));
            }
        }
        found
    }

    /// Issue 22, item 9: a lease's key is never written to the host's disk, nor put where
    /// other processes could read it (gocryptfs's command line, its environment): it reaches
    /// gocryptfs through a pipe.
    #[tokio::test]
    async fn a_leases_key_is_never_written_to_disk_nor_on_a_command_line() {
        let tools = match find_tools(std::env::var_os("PATH"), Path::new(FUSE_DEVICE)) {
            Ok(tools) => tools,
            Err(missing) => {
                assert!(
                    !required(),
                    "gocryptfs is required here (FALLOW_CI_REQUIRE_SERVICES=1): {missing}"
                );
                eprintln!("SKIPPED: the scratch key test: {missing}");
                return;
            }
        };
        let data_dir = std::env::temp_dir().join(format!("fallow-scratch-key-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&data_dir);
        let scratch_dir = data_dir.join("leases").join("7").join(SCRATCH_DIR);
        let key = LeaseKey::generate();
        let raw = key.0.to_vec();
        let hex_lower = hex::encode(&raw);
        let hex_upper = hex_lower.to_uppercase();
        let secrets: [&[u8]; 3] = [&raw, hex_lower.as_bytes(), hex_upper.as_bytes()];
        mount(&tools, &scratch_dir, &key).await.expect("the volume mounts");
        drop(key);
        assert!(is_mounted(&scratch_dir), "the scratch is a gocryptfs mount");
        // A tenant's files, written through the volume.
        std::fs::write(scratch_dir.join("weights.bin"), vec![7u8; 1 << 16]).unwrap();
        std::fs::write(scratch_dir.join("notes.txt"), b"tenant notes").unwrap();

        let cipher = cipher_dir_of(&scratch_dir).to_string_lossy().into_owned();
        let daemons = processes_naming(&cipher);
        assert!(
            !daemons.is_empty(),
            "gocryptfs serves the volume, named by its cipher directory"
        );
        for (pid, cmdline, environ) in &daemons {
            for secret in secrets {
                assert!(!contains(cmdline, secret), "process {pid}'s command line holds the key");
                assert!(!contains(environ, secret), "process {pid}'s environment holds the key");
            }
        }
        let files = files_under(&data_dir);
        assert!(
            files.iter().any(|(path, _)| path.ends_with("gocryptfs.conf")),
            "the scan sees the cipher directory: {:?}",
            files.iter().map(|(path, _)| path).collect::<Vec<_>>()
        );
        for (path, bytes) in &files {
            for secret in secrets {
                assert!(!contains(bytes, secret), "{} holds the lease's key", path.display());
            }
        }

        Scratch { tools: Some(tools) }.close(&scratch_dir).await;
        assert!(!is_mounted(&scratch_dir), "unmounted at the lease's end");
        assert!(
            !scratch_dir.exists() && !cipher_dir_of(&scratch_dir).exists(),
            "and removed"
        );
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while !processes_naming(&cipher).is_empty() && std::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert!(
            processes_naming(&cipher).is_empty(),
            "gocryptfs (and its master key) is gone"
        );
        for (path, bytes) in files_under(&data_dir) {
            for secret in secrets {
                assert!(!contains(&bytes, secret), "{} holds the lease's key", path.display());
            }
        }
        let _ = std::fs::remove_dir_all(&data_dir);
    }

    #[test]
    fn a_password_is_the_keys_hex_on_one_line_and_keys_differ() {
        let key = LeaseKey::generate();
        let line = key.password_line();
        assert_eq!(line.len(), KEY_BYTES * 2 + 1);
        assert_eq!(&line[..KEY_BYTES * 2], hex::encode(key.0.as_ref()).as_bytes());
        assert_eq!(line.last(), Some(&b'\n'));
        assert_ne!(key.0.as_ref(), LeaseKey::generate().0.as_ref());
    }
}
