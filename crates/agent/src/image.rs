//! Local container images of this binary, built without a registry or a Dockerfile: a root file
//! system of the executable (at `/fallow`), the shared libraries `ldd` says it links (at their
//! own paths), the host files named and the directories asked for, imported into Docker with
//! `docker import` and an entry point. The canary's image (`fallow canary image`) and the
//! agent's (`fallow agent image`) are made this way.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

/// What goes into an image besides the executable and its libraries.
pub struct ImageSpec<'a> {
    /// The image's tag (`name:version`).
    pub tag: &'a str,
    /// The entry point, `/fallow` and its arguments.
    pub entrypoint: &'a [&'a str],
    /// Environment variables set in the image.
    pub env: &'a [(&'a str, &'a str)],
    /// Host files copied to the same path when the host has them (a CA bundle, say).
    pub host_files: &'a [&'a str],
    /// Empty directories made in the image, with their modes (`/tmp` with 0o1777).
    pub dirs: &'a [(&'a str, u32)],
}

/// The files `ldd` says a dynamic executable needs: each library's path and the dynamic loader;
/// none for a static one. A library `ldd` cannot find is an error.
pub fn parse_ldd(text: &str) -> Result<Vec<PathBuf>, String> {
    let mut paths = Vec::new();
    for line in text.lines().map(str::trim).filter(|line| !line.is_empty()) {
        if line.contains("statically linked") || line.contains("not a dynamic executable") {
            continue;
        }
        let target = match line.split_once("=>") {
            Some((name, target)) => {
                let target = target.trim();
                if target.starts_with("not found") {
                    return Err(format!("ldd finds no {}", name.trim()));
                }
                target
            }
            None => line,
        };
        // "PATH (0xADDRESS)"; the kernel's vDSO has no path and is no file.
        let path = target.split_whitespace().next().unwrap_or("");
        if path.starts_with('/') {
            paths.push(PathBuf::from(path));
        }
    }
    Ok(paths)
}

/// The `--change` lines of `docker import` for `spec`: its entry point and environment.
pub fn import_changes(spec: &ImageSpec<'_>) -> Vec<String> {
    let entrypoint = serde_json::to_string(spec.entrypoint).unwrap_or_else(|_| "[]".into());
    let mut changes = vec![format!("ENTRYPOINT {entrypoint}")];
    changes.extend(spec.env.iter().map(|(name, value)| format!("ENV {name}={value}")));
    changes
}

/// Staging directories of builds in this process, told apart.
static BUILDS: AtomicU64 = AtomicU64::new(0);

/// Builds `spec` from `executable` as a local Docker image: stages the root file system in a
/// temporary directory, packs it with tar and imports it. The staging files are removed either
/// way.
pub fn build_image(executable: &Path, spec: &ImageSpec<'_>) -> Result<(), String> {
    let ldd = std::process::Command::new("ldd")
        .arg(executable)
        .output()
        .map_err(|error| format!("ldd: {error}"))?;
    // ldd exits 1 for a static executable, which needs no libraries.
    let libraries = parse_ldd(&String::from_utf8_lossy(&ldd.stdout))?;
    let build = BUILDS.fetch_add(1, Ordering::Relaxed);
    let root = std::env::temp_dir().join(format!("fallow-image-{}-{build}", std::process::id()));
    let tarball = root.with_extension("tar");
    let built = stage(executable, &libraries, spec, &root).and_then(|()| import(&root, &tarball, spec));
    let _ = std::fs::remove_dir_all(&root);
    let _ = std::fs::remove_file(&tarball);
    built
}

/// The image's root file system under `root`.
fn stage(executable: &Path, libraries: &[PathBuf], spec: &ImageSpec<'_>, root: &Path) -> Result<(), String> {
    use std::os::unix::fs::PermissionsExt;
    let inside = |path: &Path| root.join(path.strip_prefix("/").unwrap_or(path));
    let copy = |from: &Path, to: &Path| {
        if let Some(parent) = to.parent() {
            std::fs::create_dir_all(parent).map_err(|error| format!("{}: {error}", parent.display()))?;
        }
        std::fs::copy(from, to).map_err(|error| format!("copying {}: {error}", from.display()))
    };
    copy(executable, &root.join("fallow"))?;
    for library in libraries {
        copy(library, &inside(library))?;
    }
    for file in spec.host_files.iter().map(Path::new).filter(|file| file.is_file()) {
        copy(file, &inside(file))?;
    }
    for (dir, mode) in spec.dirs {
        let dir = inside(Path::new(dir));
        std::fs::create_dir_all(&dir).map_err(|error| format!("{}: {error}", dir.display()))?;
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(*mode))
            .map_err(|error| format!("{}: {error}", dir.display()))?;
    }
    Ok(())
}

/// Packs `root` into `tarball` and imports it as `spec.tag`.
fn import(root: &Path, tarball: &Path, spec: &ImageSpec<'_>) -> Result<(), String> {
    let tar = std::process::Command::new("tar")
        .arg("-C")
        .arg(root)
        .arg("-cf")
        .arg(tarball)
        .arg(".")
        .output()
        .map_err(|error| format!("tar: {error}"))?;
    if !tar.status.success() {
        return Err(format!("tar: {}", String::from_utf8_lossy(&tar.stderr).trim()));
    }
    let mut import = std::process::Command::new("docker");
    import.arg("import");
    for change in import_changes(spec) {
        import.arg("--change").arg(change);
    }
    let imported = import
        .arg(tarball)
        .arg(spec.tag)
        .output()
        .map_err(|error| format!("docker import (is Docker installed?): {error}"))?;
    if !imported.status.success() {
        return Err(format!(
            "docker import: {}",
            String::from_utf8_lossy(&imported.stderr).trim()
        ));
    }
    Ok(())
}

/// The tag `fallow agent image` gives the agent's image by default.
pub fn default_agent_tag() -> String {
    format!("fallow-agent:{}", env!("CARGO_PKG_VERSION"))
}

/// Where the agent in its image keeps its files: mount the host's directory at the same path
/// (`-v /var/lib/fallow/agent:/var/lib/fallow/agent`), since the Docker daemon it drives
/// resolves the replicas' scratch and checkpoint mounts on the host.
pub const AGENT_IMAGE_DATA_DIR: &str = "/var/lib/fallow/agent";

/// The agent's image: `fallow agent` as the entry point, its data directory at
/// [`AGENT_IMAGE_DATA_DIR`], the host's CA bundle for an https:// coordinator, and the variables
/// with which the NVIDIA container runtime hands it the GPUs and NVML (`--gpus all`).
pub fn build_agent_image(executable: &Path, tag: &str) -> Result<(), String> {
    build_image(
        executable,
        &ImageSpec {
            tag,
            entrypoint: &["/fallow", "agent"],
            env: &[
                ("FALLOW_AGENT_DATA_DIR", AGENT_IMAGE_DATA_DIR),
                ("NVIDIA_VISIBLE_DEVICES", "all"),
                ("NVIDIA_DRIVER_CAPABILITIES", "compute,utility"),
                // Where the NVIDIA runtime puts libnvidia-ml and libcuda in a container.
                (
                    "LD_LIBRARY_PATH",
                    "/usr/lib/x86_64-linux-gnu:/usr/lib64:/usr/local/nvidia/lib64",
                ),
            ],
            host_files: &["/etc/ssl/certs/ca-certificates.crt"],
            dirs: &[("/tmp", 0o1777), (AGENT_IMAGE_DATA_DIR, 0o750), ("/etc/fallow", 0o755)],
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ldd_output_names_the_libraries_and_the_loader() {
        let text = "\tlinux-vdso.so.1 (0x00007ffd)\n\tlibc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x00007f)\n\t/lib64/ld-linux-x86-64.so.2 (0x00007f)\n";
        assert_eq!(
            parse_ldd(text).unwrap(),
            vec![
                PathBuf::from("/lib/x86_64-linux-gnu/libc.so.6"),
                PathBuf::from("/lib64/ld-linux-x86-64.so.2"),
            ]
        );
        assert_eq!(parse_ldd("\tstatically linked\n").unwrap(), Vec::<PathBuf>::new());
        assert!(
            parse_ldd("\tlibgone.so.1 => not found\n")
                .unwrap_err()
                .contains("libgone.so.1")
        );
    }

    #[test]
    fn the_import_sets_the_entry_point_and_the_environment() {
        let spec = ImageSpec {
            tag: "t:1",
            entrypoint: &["/fallow", "agent"],
            env: &[("A", "1"), ("B", "x y")],
            host_files: &[],
            dirs: &[],
        };
        assert_eq!(
            import_changes(&spec),
            vec![r#"ENTRYPOINT ["/fallow","agent"]"#, "ENV A=1", "ENV B=x y"]
        );
    }
}
