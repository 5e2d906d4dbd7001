#!/usr/bin/env bash
# Builds a Docker image for Fallow's gang tests OFFLINE (no registry) with `docker import`, from
# files on this host: Debian's python3 and python3-torch (CPU PyTorch, gloo), the python packages
# they depend on, every shared library those need (the ldd closure), dash as /bin/sh, and the gang
# test scripts at /opt/fallow-gang/ (allreduce.py, train.py). Default command: allreduce.py.
#
# Usage: scripts/torch-image.sh [TAG]          (default fallow-torch:test)
# Needs: Debian with python3-torch installed (apt-get install python3-torch), docker, GNU tar.
# The image carries the label fallow.gang.digest, a sha256 of this script, the two gang scripts
# and the installed versions of the packages it takes; when an image with that TAG already
# carries the same digest the build is skipped (FALLOW_IMAGE_REBUILD=1 forces it).
# Prints the time the build took and the image's size; exits non-zero if the image cannot import
# torch or lacks gloo.
set -euo pipefail
self=$(realpath "$0")
cd "$(dirname "$self")/.."
tag=${1:-fallow-torch:test}
gang=crates/fallow/tests/gang
started=$(date +%s.%N)
say() { echo "torch-image: $*" >&2; }
elapsed() { awk -v now="$(date +%s.%N)" -v started="$started" 'BEGIN { printf "%.1f", now - started }'; }

dpkg-query -W -f='${db:Status-Abbrev}' python3-torch 2>/dev/null | grep -q '^ii' ||
  { say "python3-torch is not installed here: apt-get install python3-torch"; exit 1; }
command -v docker >/dev/null || { say "docker is not on PATH"; exit 1; }

# The packages the image takes: python3-torch's dependency closure, its python packages only
# (the rest of the closure is shared libraries, taken below by what the binaries really load),
# plus libtorch and dash.
closure=$(apt-cache depends --recurse --no-recommends --no-suggests --no-conflicts --no-breaks \
  --no-replaces --no-enhances python3-torch | grep -v '^[ <]' | sort -u)
installed=$(dpkg-query -W -f='${db:Status-Abbrev} ${Package}\n' | awk '$1 == "ii" {print $2}' | sort -u)
packages=$( (comm -12 <(printf '%s\n' "$closure") <(printf '%s\n' "$installed") | grep -E '^(lib)?python3'
  echo libtorch1.13; echo dash) | sort -u)

digest=$( (cat "$self" "$gang/allreduce.py" "$gang/train.py"
  dpkg-query -W -f='${Package} ${Version}\n' $packages) | sha256sum | cut -c1-64)
current=$(docker image inspect --format '{{ index .Config.Labels "fallow.gang.digest" }}' "$tag" 2>/dev/null || true)
if [ "$current" = "$digest" ] && [ "${FALLOW_IMAGE_REBUILD:-0}" != 1 ]; then
  say "$tag is up to date (fallow.gang.digest=${digest:0:16}), kept; checked in $(elapsed) s"
  exit 0
fi
previous=$(docker image inspect --format '{{.Id}}' "$tag" 2>/dev/null || true)

# Streams the image's file system as a tar: the packages' files (no docs, man pages, headers,
# static libraries), the byte code Debian compiled for their .py files, the ldd closure of every
# ELF file, each symlink with the chain it points through, and a few synthesized files.
/usr/bin/python3 - "$gang" $packages <<'PYTHON' | docker import \
  --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
  --change 'ENV LANG=C.UTF-8' --change 'ENV PYTHONUNBUFFERED=1' \
  --change "LABEL fallow.gang.digest=$digest" \
  --change 'CMD ["python3", "/opt/fallow-gang/allreduce.py"]' \
  --message "fallow gang test image (python3-torch, offline)" - "$tag" >/dev/null
import io, os, subprocess, sys, tarfile

gang, packages = sys.argv[1], sys.argv[2:]
SKIPPED_PREFIXES = ("/usr/share/doc/", "/usr/share/man/", "/usr/share/info/", "/usr/share/locale/",
                    "/usr/share/lintian/", "/usr/share/doc-base/", "/usr/include/")
SYSTEM_LIBRARY_DIRS = {"/lib/x86_64-linux-gnu", "/usr/lib/x86_64-linux-gnu", "/lib", "/usr/lib",
                       "/lib64", "/usr/lib64"}
MERGED_USR_LINKS = ("/bin", "/lib", "/lib64", "/sbin")  # synthesized below, as the host has them
entries = set()


def add_chain(path):
    # Store the canonical path (no symlinked directory on the way, /lib -> usr/lib) and, for a
    # symlink, whatever it points to (update-alternatives links included).
    for _ in range(40):
        directory = os.path.realpath(os.path.dirname(path))
        path = os.path.join(directory, os.path.basename(path))
        if path in entries or path in MERGED_USR_LINKS or not os.path.lexists(path):
            return
        entries.add(path)
        if not os.path.islink(path):
            return
        target = os.readlink(path)
        path = target if target.startswith("/") else os.path.join(directory, target)


listed = subprocess.run(["dpkg", "-L", *packages], check=True, capture_output=True, text=True).stdout
byte_code = {}
for path in sorted(set(listed.splitlines())):
    if not path.startswith("/") or path.startswith(SKIPPED_PREFIXES) or path.endswith(".a"):
        continue
    if os.path.isdir(path) and not os.path.islink(path):
        continue
    add_chain(path)
    if path.endswith(".py"):
        cache = os.path.join(os.path.dirname(path), "__pycache__")
        if cache not in byte_code:
            byte_code[cache] = os.listdir(cache) if os.path.isdir(cache) else []
        stem = os.path.basename(path)[:-3] + "."
        for name in byte_code[cache]:
            if name.startswith(stem) and name.endswith(".pyc") and name.count(".") == 2:
                add_chain(os.path.join(cache, name))

elf_files = []
for path in sorted(entries):
    if os.path.isfile(path) and not os.path.islink(path):
        with open(path, "rb") as file:
            if file.read(4) == b"\x7fELF":
                elf_files.append(path)
libraries, outside_system_dirs, missing = set(), False, set()
for start in range(0, len(elf_files), 64):
    output = subprocess.run(["ldd", *elf_files[start:start + 64]], capture_output=True, text=True).stdout
    for line in output.splitlines():
        words = line.split()
        if "=>" in words and words[words.index("=>") + 1].startswith("/"):
            libraries.add(words[words.index("=>") + 1])
        elif words and words[0].startswith("/") and not words[0].endswith(":"):
            libraries.add(words[0])
        elif "not found" in line:
            missing.add(words[0])
if missing:
    # python3-torch ships test plugins that need libtorch-test, which the image leaves out.
    print(f"torch-image: some ELF files need libraries not installed, left so: {', '.join(sorted(missing))}",
          file=sys.stderr)
for library in sorted(libraries):
    outside_system_dirs |= os.path.dirname(library) not in SYSTEM_LIBRARY_DIRS
    add_chain(library)
if outside_system_dirs:
    # Without the cache the loader only looks in the system directories.
    add_chain("/etc/ld.so.cache")

tar = tarfile.open(fileobj=sys.stdout.buffer, mode="w|", format=tarfile.GNU_FORMAT)


def synthesized(name, kind, mode, data=b"", target=""):
    info = tarfile.TarInfo(name)
    info.type, info.mode, info.linkname, info.size = kind, mode, target, len(data)
    tar.addfile(info, io.BytesIO(data) if data else None)


for link in MERGED_USR_LINKS:
    if os.path.islink(link):
        synthesized(link.lstrip("/"), tarfile.SYMTYPE, 0o777, target=os.readlink(link))
synthesized("tmp", tarfile.DIRTYPE, 0o1777)
synthesized("root", tarfile.DIRTYPE, 0o700)
synthesized("etc/passwd", tarfile.REGTYPE, 0o644,
            b"root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n")
synthesized("etc/group", tarfile.REGTYPE, 0o644, b"root:x:0:\nnogroup:x:65534:\n")
synthesized("etc/nsswitch.conf", tarfile.REGTYPE, 0o644, b"passwd: files\ngroup: files\nhosts: files dns\n")
for script in ("allreduce.py", "train.py"):
    with open(os.path.join(gang, script), "rb") as file:
        synthesized(f"opt/fallow-gang/{script}", tarfile.REGTYPE, 0o755, file.read())
total_bytes = 0
for path in sorted(entries):
    info = tar.gettarinfo(path, arcname=path.lstrip("/"))
    info.uid = info.gid = 0
    info.uname = info.gname = "root"
    if info.isreg():
        total_bytes += info.size
        with open(path, "rb") as file:
            tar.addfile(info, file)
    else:
        tar.addfile(info)
tar.close()
print(f"torch-image: {len(entries)} files from {len(packages)} packages and {len(libraries)} libraries,"
      f" {total_bytes / 2**20:.0f} MiB", file=sys.stderr)
PYTHON

if [ -n "$previous" ] && [ "$previous" != "$(docker image inspect --format '{{.Id}}' "$tag")" ]; then
  docker image rm "$previous" >/dev/null 2>&1 || true
fi
check=$(docker run --rm --network host "$tag" python3 -c \
  'import torch, torch.distributed as d; print(torch.__version__, d.is_gloo_available())') ||
  { say "FAIL: $tag cannot import torch"; exit 1; }
[ "${check##* }" = True ] || { say "FAIL: $tag has torch $check but no gloo"; exit 1; }
size_mib=$(( $(docker image inspect --format '{{.Size}}' "$tag") / 1048576 ))
say "built $tag in $(elapsed) s: ${size_mib} MiB, torch ${check% *} with gloo, fallow.gang.digest=${digest:0:16}"
