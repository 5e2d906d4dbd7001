//! A replica's output: what it leaves in `$FALLOW_OUTPUT_DIR` (a directory of its scratch space)
//! is packed as a tar archive when it ends, and shipped to the job's `output_url` (an HTTP PUT,
//! such as a presigned object-store URL) or to the coordinator, which keeps up to 16 MiB. The
//! archive's digest goes into the replica's attestation.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Duration;

use base64::Engine;
use tokio::io::AsyncReadExt;

use crate::client::Client;

/// The output directory, under a replica's scratch directory.
pub const OUTPUT_DIR: &str = "output";
/// The archive, beside the output directory (outside it, so never in itself).
const ARCHIVE_FILE: &str = ".fallow-output.tar";
/// The longest an upload to an `output_url` may take; the replica's GPUs are held meanwhile.
pub const URL_UPLOAD_TIMEOUT: Duration = Duration::from_secs(30 * 60);
/// The longest an upload to the coordinator (at most 16 MiB) may take.
pub const COORDINATOR_UPLOAD_TIMEOUT: Duration = Duration::from_secs(5 * 60);
/// Bytes read from the archive at a time while it streams to an `output_url`.
const STREAM_CHUNK_BYTES: usize = 256 * 1024;

/// A packed archive: where it is, its digest ("blake3:<hex>") and size.
#[derive(Debug, Clone, PartialEq)]
pub struct Archive {
    pub path: PathBuf,
    pub digest: String,
    pub bytes: u64,
}

/// Whether a replica left anything in its output directory.
pub fn has_output(scratch_dir: &Path) -> bool {
    std::fs::read_dir(scratch_dir.join(OUTPUT_DIR)).is_ok_and(|mut entries| entries.next().is_some())
}

/// Packs a replica's output directory into an archive beside it: entries in name order, with
/// their modes, times and owners left out (the same files give the same archive); a symbolic
/// link is kept as a link, never followed (a replica may not ship the host's files by linking
/// to them).
pub fn pack(scratch_dir: &Path) -> std::io::Result<Archive> {
    let dir = scratch_dir.join(OUTPUT_DIR);
    let path = scratch_dir.join(ARCHIVE_FILE);
    let file = std::fs::File::create(&path)?;
    let mut builder = tar::Builder::new(std::io::BufWriter::new(file));
    builder.follow_symlinks(false);
    builder.mode(tar::HeaderMode::Deterministic);
    append_sorted(&mut builder, &dir, Path::new(""))?;
    let mut writer = builder.into_inner()?;
    writer.flush()?;
    drop(writer);
    let mut hasher = blake3::Hasher::new();
    let bytes = hasher.update_reader(std::fs::File::open(&path)?)?.count();
    Ok(Archive {
        digest: format!("blake3:{}", hasher.finalize().to_hex()),
        bytes,
        path,
    })
}

fn append_sorted<W: Write>(builder: &mut tar::Builder<W>, dir: &Path, inside: &Path) -> std::io::Result<()> {
    let mut entries: Vec<_> = std::fs::read_dir(dir)?.collect::<Result<_, _>>()?;
    entries.sort_by_key(std::fs::DirEntry::file_name);
    for entry in entries {
        let name = inside.join(entry.file_name());
        let kind = entry.file_type()?;
        builder.append_path_with_name(entry.path(), &name)?;
        if kind.is_dir() {
            append_sorted(builder, &entry.path(), &name)?;
        }
    }
    Ok(())
}

/// Packs a replica's output and ships it: to `destination` (its job's output URL) when it has
/// one, else to the coordinator. Returns the archive, removed from disk once shipped.
pub async fn ship(
    client: &Client,
    key: &trust::NodeKey,
    node_id: i64,
    lease_id: i64,
    epoch: i64,
    scratch_dir: &Path,
    destination: Option<&str>,
) -> Result<Archive, String> {
    let dir = scratch_dir.to_path_buf();
    let archive = tokio::task::spawn_blocking(move || pack(&dir))
        .await
        .map_err(|error| format!("packing it: {error}"))?
        .map_err(|error| format!("packing it: {error}"))?;
    let sent = match destination {
        Some(url) => {
            let http = reqwest::Client::new();
            put_to_url(&http, url, &archive).await
        }
        None => send_to_coordinator(client, key, node_id, lease_id, epoch, &archive).await,
    };
    let _ = tokio::fs::remove_file(&archive.path).await;
    sent.map(|()| archive)
}

/// Sends an archive to `url` with an HTTP PUT (`Content-Length` given, as presigned object-store
/// URLs need), streaming it from disk.
pub async fn put_to_url(http: &reqwest::Client, url: &str, archive: &Archive) -> Result<(), String> {
    let file = tokio::fs::File::open(&archive.path)
        .await
        .map_err(|error| format!("reading the archive: {error}"))?;
    let chunks = futures_util::stream::unfold(file, |mut file| async move {
        let mut buffer = vec![0u8; STREAM_CHUNK_BYTES];
        match file.read(&mut buffer).await {
            Ok(0) => None,
            Ok(read) => {
                buffer.truncate(read);
                Some((Ok::<_, std::io::Error>(bytes::Bytes::from(buffer)), file))
            }
            Err(error) => Some((Err(error), file)),
        }
    });
    let answer = http
        .put(url)
        .header(reqwest::header::CONTENT_TYPE, "application/x-tar")
        .header(reqwest::header::CONTENT_LENGTH, archive.bytes)
        .body(reqwest::Body::wrap_stream(chunks))
        .timeout(URL_UPLOAD_TIMEOUT)
        .send()
        .await
        .map_err(|error| format!("PUT to the output URL: {}", crate::client::with_causes(&error)))?;
    if !answer.status().is_success() {
        let status = answer.status();
        let text = answer.text().await.unwrap_or_default();
        let text: String = text.chars().take(300).collect();
        return Err(format!("the output URL answered {status}: {}", text.trim()));
    }
    Ok(())
}

/// Hands an archive to the coordinator to keep (at most `api::OUTPUT_ARCHIVE_BYTES_MAX`).
pub async fn send_to_coordinator(
    client: &Client,
    key: &trust::NodeKey,
    node_id: i64,
    lease_id: i64,
    epoch: i64,
    archive: &Archive,
) -> Result<(), String> {
    if archive.bytes > api::OUTPUT_ARCHIVE_BYTES_MAX as u64 {
        return Err(format!(
            "the archive is {} bytes, more than the {} the coordinator keeps: give the job an output URL (--output-url)",
            archive.bytes,
            api::OUTPUT_ARCHIVE_BYTES_MAX
        ));
    }
    let bytes = tokio::fs::read(&archive.path)
        .await
        .map_err(|error| format!("reading the archive: {error}"))?;
    let upload = api::OutputUpload {
        epoch,
        archive_base64: base64::engine::general_purpose::STANDARD.encode(bytes),
    };
    client
        .output(key, node_id, lease_id, &upload, COORDINATOR_UPLOAD_TIMEOUT)
        .await
        .map(|_| ())
        .map_err(|error| format!("the coordinator did not take it: {error}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entries(archive: &Archive) -> Vec<(String, tar::EntryType, String)> {
        let mut read = tar::Archive::new(std::fs::File::open(&archive.path).expect("the archive"));
        read.entries()
            .expect("entries")
            .map(|entry| {
                let mut entry = entry.expect("an entry");
                let name = entry.path().expect("a path").display().to_string();
                let kind = entry.header().entry_type();
                let mut text = String::new();
                if kind.is_symlink() {
                    text = entry
                        .link_name()
                        .expect("a link")
                        .expect("its target")
                        .display()
                        .to_string();
                } else if kind.is_file() {
                    std::io::Read::read_to_string(&mut entry, &mut text).expect("its text");
                }
                (name, kind, text)
            })
            .collect()
    }

    #[test]
    fn the_output_directory_is_packed_in_name_order_with_links_kept_as_links() {
        let scratch = std::env::temp_dir().join(format!("fallow-output-test-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&scratch);
        let dir = scratch.join(OUTPUT_DIR);
        assert!(!has_output(&scratch), "no directory: nothing to ship");
        std::fs::create_dir_all(dir.join("metrics")).unwrap();
        assert!(has_output(&scratch), "an empty subdirectory is something");
        std::fs::write(dir.join("result.json"), r#"{"loss": 0.25}"#).unwrap();
        std::fs::write(dir.join("metrics/epoch-1.csv"), "step,loss\n1,0.5\n").unwrap();
        std::fs::write(scratch.join("secret"), "not output").unwrap();
        std::os::unix::fs::symlink("/etc/hostname", dir.join("host-file")).unwrap();

        let archive = pack(&scratch).expect("packed");
        assert_eq!(
            entries(&archive),
            vec![
                (
                    "host-file".to_string(),
                    tar::EntryType::Symlink,
                    "/etc/hostname".to_string()
                ),
                ("metrics".to_string(), tar::EntryType::Directory, String::new()),
                (
                    "metrics/epoch-1.csv".to_string(),
                    tar::EntryType::Regular,
                    "step,loss\n1,0.5\n".to_string()
                ),
                (
                    "result.json".to_string(),
                    tar::EntryType::Regular,
                    r#"{"loss": 0.25}"#.to_string()
                ),
            ],
            "the link is a link, not the host's file; nothing outside the directory"
        );
        let bytes = std::fs::read(&archive.path).unwrap();
        assert_eq!(archive.bytes, bytes.len() as u64);
        assert_eq!(archive.digest, format!("blake3:{}", blake3::hash(&bytes).to_hex()));
        // The same files give the same archive.
        assert_eq!(pack(&scratch).unwrap().digest, archive.digest);
        std::fs::remove_dir_all(&scratch).unwrap();
    }
}
