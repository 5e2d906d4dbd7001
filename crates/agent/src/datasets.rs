//! The dataset cache: content-addressed files (`blake3-<hex>`, `sha256-<hex>`) fetched by URL
//! before a job starts and verified by digest; a mismatch fails the lease with the reason. Its
//! contents go into every heartbeat, so the matcher can prefer nodes that hold a job's data.

use std::path::{Path, PathBuf};

use api::DatasetRequest;
use sha2::Digest;

#[derive(Debug, thiserror::Error, PartialEq)]
pub enum DatasetError {
    #[error("dataset digest {0:?} is not blake3:<64 hex> or sha256:<64 hex>")]
    BadDigest(String),
    #[error("dataset {url}: {message}")]
    Fetch { url: String, message: String },
    #[error("dataset {url}: its content does not match digest {wanted}")]
    Mismatch { url: String, wanted: String },
    #[error("dataset {url}: more than the {size_bytes} bytes announced")]
    TooLarge { url: String, size_bytes: u64 },
}

/// A digest, checked: the algorithm and 64 lowercase hex characters.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ContentDigest {
    algorithm: &'static str,
    hex: String,
}

impl ContentDigest {
    pub fn parse(text: &str) -> Result<ContentDigest, DatasetError> {
        let bad = || DatasetError::BadDigest(text.to_string());
        let (algorithm, hex) = text.split_once(':').ok_or_else(bad)?;
        let algorithm = match algorithm {
            "blake3" => "blake3",
            "sha256" => "sha256",
            _ => return Err(bad()),
        };
        if hex.len() != 64
            || !hex
                .bytes()
                .all(|byte| byte.is_ascii_digit() || (b'a'..=b'f').contains(&byte))
        {
            return Err(bad());
        }
        Ok(ContentDigest {
            algorithm,
            hex: hex.to_string(),
        })
    }

    /// The cache's file name, e.g. `blake3-<hex>`.
    pub fn file_name(&self) -> String {
        format!("{}-{}", self.algorithm, self.hex)
    }

    /// The digest a cache file's name stands for; `None` for any other file (a partial fetch).
    fn of_file_name(name: &str) -> Option<ContentDigest> {
        let (algorithm, hex) = name.split_once('-')?;
        ContentDigest::parse(&format!("{algorithm}:{hex}")).ok()
    }
}

impl std::fmt::Display for ContentDigest {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(formatter, "{}:{}", self.algorithm, self.hex)
    }
}

enum Hasher {
    Blake3(Box<blake3::Hasher>),
    Sha256(sha2::Sha256),
}

impl Hasher {
    fn new(algorithm: &str) -> Hasher {
        if algorithm == "blake3" {
            Hasher::Blake3(Box::new(blake3::Hasher::new()))
        } else {
            Hasher::Sha256(sha2::Sha256::new())
        }
    }

    fn update(&mut self, bytes: &[u8]) {
        match self {
            Hasher::Blake3(hasher) => {
                hasher.update(bytes);
            }
            Hasher::Sha256(hasher) => hasher.update(bytes),
        }
    }

    fn hex(self) -> String {
        match self {
            Hasher::Blake3(hasher) => hasher.finalize().to_hex().to_string(),
            Hasher::Sha256(hasher) => hex::encode(hasher.finalize()),
        }
    }
}

/// The cache directory.
#[derive(Clone, Debug)]
pub struct DatasetCache {
    dir: PathBuf,
    /// Whether `file://` URLs may be read (off by default: a tenant must not make the agent
    /// copy files of the provider's host into a job).
    allow_files: bool,
    /// What the cache keeps at most, in bytes, before a fetch makes room (`None`: no limit).
    limit_bytes: Option<u64>,
}

/// A file the cache holds: its name, size, and when a replica last asked for it.
struct Entry {
    name: String,
    bytes: u64,
    used: std::time::SystemTime,
    /// Linked into a running replica's directory: removing it would free nothing now.
    in_use: bool,
}

impl DatasetCache {
    pub fn new(dir: PathBuf, allow_files: bool) -> DatasetCache {
        DatasetCache {
            dir,
            allow_files,
            limit_bytes: None,
        }
    }

    /// The cache keeping at most `bytes` (the agent's `--dataset-cache-gib`): before a fetch,
    /// the datasets used least recently and in use by no replica are removed until the new one
    /// fits. A dataset larger than the limit is still fetched (its job needs it), with every
    /// other one that can go gone first.
    pub fn with_limit(self, bytes: Option<u64>) -> DatasetCache {
        DatasetCache {
            limit_bytes: bytes,
            ..self
        }
    }

    /// What the cache holds now, least recently used first.
    fn entries(&self) -> Vec<Entry> {
        use std::os::unix::fs::MetadataExt;
        let Ok(listing) = std::fs::read_dir(&self.dir) else {
            return Vec::new();
        };
        let mut entries: Vec<Entry> = listing
            .filter_map(|entry| {
                let entry = entry.ok()?;
                let name = entry.file_name().into_string().ok()?;
                ContentDigest::of_file_name(&name)?;
                let meta = entry.metadata().ok()?;
                Some(Entry {
                    name,
                    bytes: meta.len(),
                    used: meta.modified().ok()?,
                    in_use: meta.nlink() > 1,
                })
            })
            .collect();
        entries.sort_by(|a, b| a.used.cmp(&b.used).then_with(|| a.name.cmp(&b.name)));
        entries
    }

    /// Removes the least recently used datasets no replica holds until `incoming` more bytes
    /// fit under the limit; returns the names removed.
    fn make_room(&self, incoming: u64) -> Vec<String> {
        let Some(limit) = self.limit_bytes else {
            return Vec::new();
        };
        let entries = self.entries();
        let mut kept: u64 = entries.iter().map(|entry| entry.bytes).sum();
        let mut removed = Vec::new();
        for entry in entries.iter().filter(|entry| !entry.in_use) {
            if kept.saturating_add(incoming) <= limit {
                break;
            }
            if std::fs::remove_file(self.dir.join(&entry.name)).is_ok() {
                kept -= entry.bytes;
                removed.push(entry.name.clone());
            }
        }
        removed
    }

    /// Marks a cached file as used now (its modification time: what eviction orders by).
    fn touch(path: &Path) {
        if let Ok(file) = std::fs::OpenOptions::new().write(true).open(path) {
            let _ = file.set_modified(std::time::SystemTime::now());
        }
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The digests the cache holds, sorted.
    pub fn digests(&self) -> Vec<String> {
        let mut digests: Vec<String> = std::fs::read_dir(&self.dir)
            .map(|entries| {
                entries
                    .filter_map(|entry| entry.ok()?.file_name().into_string().ok())
                    .filter_map(|name| ContentDigest::of_file_name(&name).map(|digest| digest.to_string()))
                    .collect()
            })
            .unwrap_or_default();
        digests.sort();
        digests
    }

    /// Puts the cached files of `datasets` (fetched already) in `dir`, a directory of the
    /// replica's own, by their cache names: the replica sees its job's datasets and no other
    /// tenant's. Hard links (no copy, and a file stays whole for the replica whatever becomes of
    /// the cache's entry); a copy where the two are on different file systems.
    pub async fn link_into(&self, datasets: &[DatasetRequest], dir: &Path) -> Result<(), DatasetError> {
        let _ = tokio::fs::remove_dir_all(dir).await;
        let linked = self.link_each(datasets, dir).await;
        if linked.is_err() {
            let _ = tokio::fs::remove_dir_all(dir).await;
        }
        linked
    }

    async fn link_each(&self, datasets: &[DatasetRequest], dir: &Path) -> Result<(), DatasetError> {
        let fail = |dataset: &DatasetRequest, message: String| DatasetError::Fetch {
            url: dataset.url.clone(),
            message,
        };
        let Some(first) = datasets.first() else {
            return Ok(());
        };
        tokio::fs::create_dir_all(dir)
            .await
            .map_err(|error| fail(first, format!("{}: {error}", dir.display())))?;
        for dataset in datasets {
            let name = ContentDigest::parse(&dataset.digest)?.file_name();
            let (from, to) = (self.dir.join(&name), dir.join(&name));
            if to.exists() {
                continue; // named twice
            }
            if tokio::fs::hard_link(&from, &to).await.is_err() {
                tokio::fs::copy(&from, &to)
                    .await
                    .map_err(|error| fail(dataset, format!("{} to {}: {error}", from.display(), to.display())))?;
            }
        }
        Ok(())
    }

    /// The dataset's file in the cache, fetched and verified first if it is not there yet.
    pub async fn fetch(&self, http: &reqwest::Client, dataset: &DatasetRequest) -> Result<PathBuf, DatasetError> {
        use tokio::io::AsyncWriteExt;
        let digest = ContentDigest::parse(&dataset.digest)?;
        let path = self.dir.join(digest.file_name());
        if path.is_file() {
            Self::touch(&path);
            return Ok(path);
        }
        let fail = |message: String| DatasetError::Fetch {
            url: dataset.url.clone(),
            message,
        };
        tokio::fs::create_dir_all(&self.dir)
            .await
            .map_err(|error| fail(format!("{}: {error}", self.dir.display())))?;
        let removed = self.make_room(dataset.size_bytes);
        if !removed.is_empty() {
            tracing::info!(?removed, for_url = %dataset.url, "datasets used least recently removed from the cache to make room");
        }
        // A file of this fetch's own: a dataset staged ahead and a replica's staging may fetch
        // the same one at once; each renames its own whole, verified file into place.
        static FETCHES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let fetch = FETCHES.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let partial = self.dir.join(format!(
            ".{}.{}-{fetch}.partial",
            digest.file_name(),
            std::process::id()
        ));
        let mut file = tokio::fs::File::create(&partial)
            .await
            .map_err(|error| fail(format!("{}: {error}", partial.display())))?;
        let mut hasher = Hasher::new(digest.algorithm);
        let mut written: u64 = 0;
        let limit = (dataset.size_bytes > 0).then_some(dataset.size_bytes);
        let result: Result<(), DatasetError> = async {
            let mut write = async |bytes: &[u8]| -> Result<(), DatasetError> {
                written += bytes.len() as u64;
                if limit.is_some_and(|limit| written > limit) {
                    return Err(DatasetError::TooLarge {
                        url: dataset.url.clone(),
                        size_bytes: dataset.size_bytes,
                    });
                }
                hasher.update(bytes);
                file.write_all(bytes).await.map_err(|error| fail(error.to_string()))
            };
            if let Some(local) = dataset.url.strip_prefix("file://") {
                if !self.allow_files {
                    return Err(fail("file:// URLs are not allowed on this node".into()));
                }
                let bytes = tokio::fs::read(local).await.map_err(|error| fail(error.to_string()))?;
                write(&bytes).await?;
            } else if dataset.url.starts_with("http://") || dataset.url.starts_with("https://") {
                let mut response = http
                    .get(&dataset.url)
                    .send()
                    .await
                    .and_then(reqwest::Response::error_for_status)
                    .map_err(|error| fail(error.to_string()))?;
                while let Some(chunk) = response.chunk().await.map_err(|error| fail(error.to_string()))? {
                    write(&chunk).await?;
                }
            } else {
                return Err(fail("only http://, https:// (and, where allowed, file://) URLs".into()));
            }
            file.flush().await.map_err(|error| fail(error.to_string()))?;
            file.sync_all().await.map_err(|error| fail(error.to_string()))
        }
        .await;
        if let Err(error) = result {
            let _ = tokio::fs::remove_file(&partial).await;
            return Err(error);
        }
        if hasher.hex() != digest.hex {
            let _ = tokio::fs::remove_file(&partial).await;
            return Err(DatasetError::Mismatch {
                url: dataset.url.clone(),
                wanted: digest.to_string(),
            });
        }
        tokio::fs::rename(&partial, &path)
            .await
            .map_err(|error| fail(format!("{}: {error}", path.display())))?;
        Ok(path)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dataset(url: String, digest: String, size_bytes: u64) -> DatasetRequest {
        DatasetRequest {
            url,
            digest,
            size_bytes,
        }
    }

    #[tokio::test]
    async fn a_dataset_is_fetched_verified_and_cached_by_digest() {
        let dir = std::env::temp_dir().join(format!("fallow-datasets-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let source = dir.join("source.txt");
        std::fs::write(&source, b"tokens tokens tokens\n").unwrap();
        let blake = format!("blake3:{}", blake3::hash(b"tokens tokens tokens\n").to_hex());
        let sha = format!(
            "sha256:{}",
            hex::encode(sha2::Sha256::digest(b"tokens tokens tokens\n"))
        );
        let url = format!("file://{}", source.display());
        let http = reqwest::Client::new();
        let cache = DatasetCache::new(dir.join("cache"), true);
        for digest in [&blake, &sha] {
            let path = cache
                .fetch(&http, &dataset(url.clone(), digest.clone(), 21))
                .await
                .unwrap();
            assert_eq!(std::fs::read(&path).unwrap(), b"tokens tokens tokens\n");
        }
        let mut held = vec![blake.clone(), sha.clone()];
        held.sort();
        assert_eq!(cache.digests(), held, "the cache reports what it holds");
        let wrong = format!("blake3:{}", "0".repeat(64));
        assert_eq!(
            cache.fetch(&http, &dataset(url.clone(), wrong.clone(), 0)).await,
            Err(DatasetError::Mismatch {
                url: url.clone(),
                wanted: wrong
            })
        );
        assert_eq!(cache.digests().len(), 2, "nothing of a mismatch is kept");
        let other = format!("sha256:{}", "1".repeat(64));
        assert!(matches!(
            cache.fetch(&http, &dataset(url.clone(), other.clone(), 5)).await,
            Err(DatasetError::TooLarge { size_bytes: 5, .. })
        ));
        let closed = DatasetCache::new(dir.join("closed"), false);
        assert!(matches!(
            closed.fetch(&http, &dataset(url.clone(), blake.clone(), 0)).await,
            Err(DatasetError::Fetch { .. })
        ));
        for bad in ["blake3:xyz", "md5:00", &format!("BLAKE3:{}", "a".repeat(64))] {
            assert!(ContentDigest::parse(bad).is_err(), "{bad}");
        }
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[tokio::test]
    async fn a_full_cache_removes_what_was_used_least_lately_and_no_replica_holds() {
        let dir = std::env::temp_dir().join(format!("fallow-datasets-full-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let http = reqwest::Client::new();
        let cache = DatasetCache::new(dir.join("cache"), true).with_limit(Some(100));
        let mut made = Vec::new();
        for index in 0..5u8 {
            let bytes = vec![b'a' + index; 40];
            let source = dir.join(format!("{index}.bin"));
            std::fs::write(&source, &bytes).unwrap();
            let digest = format!("blake3:{}", blake3::hash(&bytes).to_hex());
            made.push(dataset(format!("file://{}", source.display()), digest, 40));
        }
        let held = |cache: &DatasetCache| {
            let mut names: Vec<String> = made
                .iter()
                .enumerate()
                .filter(|(_, wanted)| cache.digests().contains(&wanted.digest))
                .map(|(index, _)| index.to_string())
                .collect();
            names.sort();
            names.join(",")
        };
        let step = || std::thread::sleep(std::time::Duration::from_millis(20));
        for index in [0, 1] {
            cache.fetch(&http, &made[index]).await.unwrap();
            step();
        }
        cache.fetch(&http, &made[0]).await.unwrap(); // used again: 1 is now the least lately
        step();
        cache.fetch(&http, &made[2]).await.unwrap();
        assert_eq!(held(&cache), "0,2", "80 + 40 > 100: the least lately used went");
        step();
        // 0 is in a replica's hands: 2 goes instead, though used later.
        cache.link_into(&made[..1], &dir.join("lease-1")).await.unwrap();
        cache.fetch(&http, &made[3]).await.unwrap();
        assert_eq!(held(&cache), "0,3");
        // Larger than the limit: still fetched, with all else that can go gone.
        let big = vec![b'z'; 150];
        let source = dir.join("big.bin");
        std::fs::write(&source, &big).unwrap();
        let wanted = dataset(
            format!("file://{}", source.display()),
            format!("blake3:{}", blake3::hash(&big).to_hex()),
            150,
        );
        cache.fetch(&http, &wanted).await.unwrap();
        assert_eq!(held(&cache), "0", "only the linked one stays");
        assert!(cache.digests().contains(&wanted.digest));
        // Without a limit nothing goes.
        let open = DatasetCache::new(dir.join("cache"), true);
        open.fetch(&http, &made[4]).await.unwrap();
        assert_eq!(held(&open), "0,4");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[tokio::test]
    async fn a_replica_sees_its_jobs_datasets_and_no_others() {
        let dir = std::env::temp_dir().join(format!("fallow-datasets-linked-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let http = reqwest::Client::new();
        let cache = DatasetCache::new(dir.join("cache"), true);
        let mut staged = Vec::new();
        for text in ["one tenant's corpus\n", "another tenant's weights\n"] {
            let source = dir.join(format!("{}.txt", staged.len()));
            std::fs::write(&source, text).unwrap();
            let digest = format!("blake3:{}", blake3::hash(text.as_bytes()).to_hex());
            let wanted = dataset(format!("file://{}", source.display()), digest, text.len() as u64);
            cache.fetch(&http, &wanted).await.unwrap();
            staged.push(wanted);
        }
        assert_eq!(cache.digests().len(), 2);

        let own = dir.join("lease-7").join("datasets");
        let mine = [staged[0].clone(), staged[0].clone()];
        cache.link_into(&mine, &own).await.unwrap();
        let name = ContentDigest::parse(&staged[0].digest).unwrap().file_name();
        let listed: Vec<String> = std::fs::read_dir(&own)
            .unwrap()
            .map(|entry| entry.unwrap().file_name().into_string().unwrap())
            .collect();
        assert_eq!(listed, vec![name.clone()], "only the job's own dataset");
        // The replica's file stays whole whatever becomes of the cache's entry.
        std::fs::remove_file(cache.dir().join(&name)).unwrap();
        assert_eq!(std::fs::read(own.join(&name)).unwrap(), b"one tenant's corpus\n");
        // A dataset not in the cache cannot be linked: the error names it, and nothing is left.
        assert!(matches!(
            cache.link_into(&staged[..1], &own).await,
            Err(DatasetError::Fetch { .. })
        ));
        assert!(!own.exists());
        let _ = std::fs::remove_dir_all(&dir);
    }
}
