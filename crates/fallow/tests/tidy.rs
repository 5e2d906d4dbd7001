//! Tidy: rules about the shape of the source tree that the compiler does not check, run by
//! `cargo test` like rust-analyzer's `xtask/src/tidy.rs`. Each rule is its own test, and each
//! failure names the file (and line) that breaks it, the rule, and how to fix it.
//!
//! - Every source file under `crates/*/src` opens with a `//!` comment saying what it is for.
//! - The `server` crate is layered, lowest first: the leaves that never name `AppState` (errors,
//!   money, config, the clock, metrics, the books, the wire views, ...) → the fleet view →
//!   `AppState` → the services that take `&AppState` (lifecycle, fraud, canaries, reputation,
//!   heartbeats, ...) → reconcile → the HTTP routes → the dashboard (which renders what the
//!   routes return) → `lib.rs` (which wires the router).
//!   A module may only name modules below it, so nothing below the routes names `crate::routes`
//!   or `crate::dashboard`, and no two modules name each other, directly or in a longer circle.
//!   The circle check works at the granularity of top-level modules (`routes/jobs.rs` is
//!   `routes`), ignores comments, strings and `#[cfg(test)]` items, and reads `crate::` paths
//!   only (`super::` inside one top-level module never leaves it).
//! - The pure crates (`matcher`, `model`, `ledger`, `trust`) do no IO: none depends, even
//!   transitively, on tokio, sqlx, reqwest, axum or hyper, so the simulator and the property tests
//!   run them as plain functions. This reads `cargo metadata`'s resolved graph, which unifies
//!   features over the whole workspace, so an optional IO dependency that another crate switches
//!   on shows up here too.
//! - No source file grows past a size a reader can hold; the files that were split because they
//!   had grown too big stay well under it.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

/// The most lines any `.rs` file under `crates/*/src` or `crates/*/tests` may have: past this a
/// file is several things, and one should be split out of it into its own module.
const MAX_LINES: usize = 1_500;

/// The most lines of a file in a module that was split because it had grown too big (the HTTP
/// routes, the agent's loop, the simulator's engine): the split is kept by keeping each part
/// well under [`MAX_LINES`], so that a part grows into a new part instead of back into a heap.
const SPLIT_MAX_LINES: usize = 1_000;

/// The folders (relative to the workspace root) whose files all fall under [`SPLIT_MAX_LINES`].
const SPLIT_DIRS: &[&str] = &[
    "crates/server/src/routes/",
    "crates/agent/src/agent/",
    "crates/sim/src/market/engine/",
];

/// The single files that fall under [`SPLIT_MAX_LINES`]: the simulator's engine and its parts.
const SPLIT_FILES: &[&str] = &[
    "crates/sim/src/market/engine.rs",
    "crates/sim/src/market/tally.rs",
    "crates/sim/src/market/trace.rs",
];

/// The crates that must stay pure computation.
const PURE_CRATES: &[&str] = &["matcher", "model", "ledger", "trust"];

/// The crates that do IO (or exist to): none of the pure crates may reach one.
const IO_CRATES: &[&str] = &["tokio", "sqlx", "reqwest", "axum", "hyper"];

/// The `server` crate's sources, relative to the workspace root.
const SERVER_SRC: &str = "crates/server/src";

/// The top-level modules of `server` that sit above everything else: only these may name the
/// routes or the dashboard.
const ABOVE_ROUTES: &[&str] = &["lib", "routes", "dashboard"];

// ---------------------------------------------------------------------------------------------
// The rules.
// ---------------------------------------------------------------------------------------------

#[test]
fn source_files_start_with_a_module_doc() {
    let root = workspace_root();
    let mut violations = Vec::new();
    for file in crate_files(&root, "src") {
        let text = read(&file);
        let first = text
            .lines()
            .map(str::trim)
            .enumerate()
            .find(|(_, line)| !line.is_empty());
        if !first.is_some_and(|(_, line)| line.starts_with("//!")) {
            let (at, shown) = first.map_or((1, "<empty file>".to_string()), |(i, line)| {
                (i + 1, format!("`{line}`"))
            });
            violations.push(format!("{}:{at}: starts with {shown}, not `//!`", rel(&root, &file)));
        }
    }
    fail_if(
        "every .rs file under crates/*/src starts with a `//!` doc comment",
        &violations,
        "open each file with `//!` lines saying what the module is for and why it is separate",
    );
}

#[test]
fn server_modules_below_the_routes_do_not_name_them() {
    let root = workspace_root();
    let mut violations = Vec::new();
    for file in rust_files(&root.join(SERVER_SRC)) {
        if ABOVE_ROUTES.contains(&server_module(&root, &file).as_str()) {
            continue;
        }
        // Tests included: a test that drives a route belongs with the routes.
        let code = code_only(&read(&file));
        for (line, name) in crate_paths(&code) {
            if name == "routes" || name == "dashboard" {
                violations.push(format!("{}:{line}: names `crate::{name}`", rel(&root, &file)));
            }
        }
    }
    fail_if(
        "in `server`, only lib.rs, routes/ and dashboard/ name `crate::routes` or `crate::dashboard`",
        &violations,
        "move what the lower module needs from the routes down into it (or into a service \
         module), and let the route call it, not the other way round",
    );
}

#[test]
fn server_modules_do_not_import_each_other_in_a_circle() {
    let root = workspace_root();
    let graph = server_graph(&root);
    let mut adjacency = BTreeMap::<String, BTreeSet<String>>::new();
    for (from, to) in graph.keys() {
        adjacency.entry(from.clone()).or_default().insert(to.clone());
    }
    let cycles = find_cycles(&adjacency);
    let caught = cycles.iter().flatten().map(String::as_str).collect::<BTreeSet<_>>();
    let caught = caught.into_iter().collect::<Vec<_>>().join(", ");
    let mut violations = Vec::new();
    for cycle in &cycles {
        let mut report = cycle_path(cycle);
        for (i, from) in cycle.iter().enumerate() {
            let to = &cycle[(i + 1) % cycle.len()];
            let (file, line) = &graph[&(from.clone(), to.clone())];
            report.push_str(&format!("\n      {from} -> {to}: {file}:{line} names `crate::{to}`"));
        }
        violations.push(report);
    }
    fail_if(
        &format!("the top-level modules of `server` do not import each other in a circle (caught in one: {caught})"),
        &violations,
        "decide which module of each circle is the lower layer (see the order in the doc of \
         crates/fallow/tests/tidy.rs) and remove its `crate::` mention of the higher one: move the \
         shared item down into the lower module (or a new leaf module both can name), or have the \
         higher module pass it in as an argument",
    );
}

#[test]
fn pure_crates_do_not_depend_on_io_crates() {
    let root = workspace_root();
    let output = Command::new(env!("CARGO"))
        .args(["metadata", "--format-version", "1"])
        .current_dir(&root)
        .output()
        .unwrap_or_else(|err| panic!("tidy: could not run `{} metadata`: {err}", env!("CARGO")));
    assert!(
        output.status.success(),
        "tidy: `cargo metadata --format-version 1` failed ({}):\n{}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    let metadata: Value = serde_json::from_slice(&output.stdout).expect("tidy: `cargo metadata` printed no JSON");
    let violations = io_paths(&metadata)
        .into_iter()
        .map(|path| {
            format!(
                "{} reaches `{}` through {}",
                path[0],
                path[path.len() - 1],
                path.join(" -> ")
            )
        })
        .collect::<Vec<_>>();
    fail_if(
        "the pure crates (matcher, model, ledger, trust) do not depend on tokio, sqlx, reqwest, axum or hyper",
        &violations,
        "keep the IO in `server`, `store`, `agent` or `fallow` and hand the pure crate plain values; \
         if the dependency comes through a crate that needs it only for tests, make it a \
         [dev-dependencies] entry",
    );
}

#[test]
fn source_files_stay_small() {
    let root = workspace_root();
    let mut violations = Vec::new();
    for file in crate_files(&root, "src").into_iter().chain(crate_files(&root, "tests")) {
        let path = rel(&root, &file);
        let lines = read(&file).lines().count();
        let split = SPLIT_DIRS.iter().any(|dir| path.starts_with(dir)) || SPLIT_FILES.contains(&path.as_str());
        let (limit, why) = if split {
            (SPLIT_MAX_LINES, "a part of a module split for size")
        } else {
            (MAX_LINES, "any source file")
        };
        if lines > limit {
            violations.push(format!("{path}: {lines} lines, over the {limit} allowed for {why}"));
        }
    }
    fail_if(
        "source files stay under MAX_LINES (1,500); the parts of split modules under SPLIT_MAX_LINES (1,000)",
        &violations,
        "split the file: move a self-contained part (a type and its impls, a group of tests on one \
         feature) into a module of its own next to it",
    );
}

/// The dependency walk checked on a made-up `cargo metadata`: it follows normal dependencies
/// (a platform-specific one too) and not dev- or build-dependencies.
#[test]
fn tidy_follows_normal_dependencies_only() {
    let package = |name: &str| serde_json::json!({ "id": format!("{name}-id"), "name": name });
    let dep = |name: &str, kind: Value, target: Value| {
        let kinds = serde_json::json!([{ "kind": kind, "target": target }]);
        serde_json::json!({ "name": name, "pkg": format!("{name}-id"), "dep_kinds": kinds })
    };
    let names = [
        "model", "matcher", "ledger", "trust", "helper", "tokio", "sqlx", "hyper",
    ];
    let metadata = serde_json::json!({
        "packages": names.iter().map(|name| package(name)).collect::<Vec<_>>(),
        "workspace_members": ["model-id", "matcher-id", "ledger-id", "trust-id"],
        "resolve": { "nodes": [
            { "id": "model-id", "deps": [dep("helper", Value::Null, Value::Null)] },
            { "id": "helper-id", "deps": [dep("tokio", Value::Null, Value::from("cfg(unix)"))] },
            { "id": "matcher-id", "deps": [dep("sqlx", Value::from("dev"), Value::Null)] },
            { "id": "ledger-id", "deps": [dep("hyper", Value::from("build"), Value::Null)] },
            { "id": "trust-id", "deps": [dep("model", Value::Null, Value::Null)] },
            { "id": "tokio-id", "deps": [] },
        ] },
    });
    assert_eq!(
        io_paths(&metadata),
        [
            vec!["model", "helper", "tokio"],
            vec!["trust", "model", "helper", "tokio"]
        ]
    );
}

/// The checker checked: a two-module circle is found, a `crate::` path in each of its forms is
/// read, and comments, strings and test items are not.
#[test]
fn tidy_finds_circles_and_reads_crate_paths() {
    let graph = BTreeMap::from([
        ("a".to_string(), BTreeSet::from(["b".to_string(), "a".to_string()])),
        ("b".to_string(), BTreeSet::from(["a".to_string(), "c".to_string()])),
        ("c".to_string(), BTreeSet::new()),
    ]);
    let cycles = find_cycles(&graph);
    assert_eq!(
        cycles.iter().map(|cycle| cycle_path(cycle)).collect::<Vec<_>>(),
        ["a -> b -> a"]
    );

    let longer = BTreeMap::from([
        ("x".to_string(), BTreeSet::from(["y".to_string()])),
        ("y".to_string(), BTreeSet::from(["z".to_string()])),
        ("z".to_string(), BTreeSet::from(["x".to_string()])),
    ]);
    assert_eq!(
        find_cycles(&longer)
            .iter()
            .map(|cycle| cycle_path(cycle))
            .collect::<Vec<_>>(),
        ["x -> y -> z -> x"]
    );
    let tangle = BTreeMap::from([
        ("a".to_string(), BTreeSet::from(["b".to_string(), "c".to_string()])),
        ("b".to_string(), BTreeSet::from(["a".to_string(), "c".to_string()])),
        ("c".to_string(), BTreeSet::from(["b".to_string()])),
    ]);
    // a -> c -> b -> a passes no module the two pairs do not.
    assert_eq!(
        find_cycles(&tangle)
            .iter()
            .map(|cycle| cycle_path(cycle))
            .collect::<Vec<_>>(),
        ["a -> b -> a", "b -> c -> b"]
    );
    let chain = BTreeMap::from([("x".to_string(), BTreeSet::from(["y".to_string()]))]);
    assert!(find_cycles(&chain).is_empty());

    let names = |src: &str| {
        crate_paths(&code_only(src))
            .into_iter()
            .map(|(_, name)| name)
            .collect::<Vec<_>>()
    };
    assert_eq!(names("use crate::{a, b::{c, d}};"), ["a", "b"]);
    assert_eq!(
        names("use crate::{\n    self,\n    e::{f, g::{h}},\n    i as j,\n};\nfn k() { crate :: l::m(); }"),
        ["e", "i", "l"]
    );
    assert_eq!(
        names(
            "pub(crate) fn f() {} // crate::a\n/* crate::b */ const S: &str = \"crate::c\"; \
             $crate::d!(); r#\"crate::e\"#"
        ),
        Vec::<String>::new()
    );
    let lines = crate_paths(&code_only("//! doc\nuse crate::{\n    a,\n    b,\n};\n"));
    assert_eq!(lines, [(3, "a".to_string()), (4, "b".to_string())]);

    let tests_stripped = without_test_items(&code_only(
        "use crate::a;\n#[cfg(test)]\nmod tests {\n    fn f() { let _ = '{'; crate::b::c(); }\n}\n\
         #[cfg(test)]\nuse crate::c;\nfn g() { crate::d(); }\n",
    ));
    assert_eq!(
        crate_paths(&tests_stripped)
            .into_iter()
            .map(|(_, name)| name)
            .collect::<Vec<_>>(),
        ["a", "d"]
    );
}

// ---------------------------------------------------------------------------------------------
// The tree.
// ---------------------------------------------------------------------------------------------

/// The workspace root: two levels above this crate.
fn workspace_root() -> PathBuf {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    root.canonicalize()
        .unwrap_or_else(|err| panic!("tidy: no workspace root at {}: {err}", root.display()))
}

/// The `.rs` files under `crates/*/<sub>`, sorted.
fn crate_files(root: &Path, sub: &str) -> Vec<PathBuf> {
    sorted_entries(&root.join("crates"))
        .into_iter()
        .map(|krate| krate.join(sub))
        .filter(|dir| dir.is_dir())
        .flat_map(|dir| rust_files(&dir))
        .collect()
}

/// The `.rs` files under `dir`, recursively and sorted, skipping any `target` folder.
fn rust_files(dir: &Path) -> Vec<PathBuf> {
    let mut files = Vec::new();
    for path in sorted_entries(dir) {
        if path.is_dir() {
            if path.file_name().is_some_and(|name| name != "target") {
                files.extend(rust_files(&path));
            }
        } else if path.extension().is_some_and(|ext| ext == "rs") {
            files.push(path);
        }
    }
    files
}

fn sorted_entries(dir: &Path) -> Vec<PathBuf> {
    let entries = std::fs::read_dir(dir).unwrap_or_else(|err| panic!("tidy: cannot list {}: {err}", dir.display()));
    let mut paths = entries
        .map(|entry| {
            entry
                .unwrap_or_else(|err| panic!("tidy: cannot list {}: {err}", dir.display()))
                .path()
        })
        .collect::<Vec<_>>();
    paths.sort();
    paths
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|err| panic!("tidy: cannot read {}: {err}", path.display()))
}

/// `path` relative to the workspace root, with `/` between its parts.
fn rel(root: &Path, path: &Path) -> String {
    let relative = path.strip_prefix(root).unwrap_or(path);
    relative
        .components()
        .map(|part| part.as_os_str().to_string_lossy())
        .collect::<Vec<_>>()
        .join("/")
}

/// Panics, listing every violation of `rule` and how to fix it, if there is any.
fn fail_if(rule: &str, violations: &[String], fix: &str) {
    if violations.is_empty() {
        return;
    }
    let list = violations
        .iter()
        .map(|violation| format!("  - {violation}"))
        .collect::<Vec<_>>()
        .join("\n");
    panic!(
        "\ntidy: {} violation(s) of the rule: {rule}\n{list}\nhow to fix: {fix}\n",
        violations.len()
    );
}

// ---------------------------------------------------------------------------------------------
// The `server` module graph.
// ---------------------------------------------------------------------------------------------

/// The top-level module of `server` that `file` belongs to: `state.rs` is `state`,
/// `routes/jobs.rs` and `routes/mod.rs` are `routes`, `lib.rs` is `lib`.
fn server_module(root: &Path, file: &Path) -> String {
    let path = rel(&root.join(SERVER_SRC), file);
    let first = path.split('/').next().unwrap_or(&path);
    first.strip_suffix(".rs").unwrap_or(first).to_string()
}

/// Every edge `from -> to` between the top-level modules of `server` (`from` names
/// `crate::to` outside a comment, string or `#[cfg(test)]` item), with where it is first named.
/// A `crate::` name that is not a module (an item of `lib.rs`, or one it re-exports) is `lib`.
fn server_graph(root: &Path) -> BTreeMap<(String, String), (String, usize)> {
    let files = rust_files(&root.join(SERVER_SRC));
    let modules = files
        .iter()
        .map(|file| server_module(root, file))
        .collect::<BTreeSet<_>>();
    let mut graph = BTreeMap::new();
    for file in &files {
        let from = server_module(root, file);
        for (line, name) in crate_paths(&without_test_items(&code_only(&read(file)))) {
            let to = if modules.contains(&name) {
                name
            } else {
                "lib".to_string()
            };
            if to != from {
                graph
                    .entry((from.clone(), to))
                    .or_insert_with(|| (rel(root, file), line));
            }
        }
    }
    graph
}

/// The circles to show, each as its modules in order (the last one names the first), starting
/// at its smallest module. Of the shortest circle through each edge that lies on any, shortest
/// first, this keeps every pair of modules that name each other and every circle that passes a
/// module no circle kept before did: enough to show each module caught in a circle without
/// listing every way round a big one.
fn find_cycles(graph: &BTreeMap<String, BTreeSet<String>>) -> Vec<Vec<String>> {
    let mut candidates = BTreeSet::new();
    for (from, tos) in graph {
        for to in tos {
            if to == from {
                continue;
            }
            if let Some(back) = shortest_path(graph, to, from) {
                // `back` runs to ... from; the circle is from -> to -> ... (-> from).
                let mut cycle = vec![from.clone()];
                cycle.extend(back.into_iter().take_while(|node| node != from));
                let smallest = (0..cycle.len()).min_by_key(|&i| &cycle[i]).unwrap_or(0);
                cycle.rotate_left(smallest);
                candidates.insert(cycle);
            }
        }
    }
    let mut candidates = candidates.into_iter().collect::<Vec<_>>();
    candidates.sort_by_key(Vec::len);
    let mut shown = BTreeSet::new();
    let mut cycles = Vec::new();
    for cycle in candidates {
        if cycle.len() == 2 || cycle.iter().any(|node| !shown.contains(node)) {
            shown.extend(cycle.iter().cloned());
            cycles.push(cycle);
        }
    }
    cycles
}

/// The shortest path `from` ... `to` in `graph`, both ends included.
fn shortest_path(graph: &BTreeMap<String, BTreeSet<String>>, from: &str, to: &str) -> Option<Vec<String>> {
    let mut parent = BTreeMap::<&str, &str>::new();
    let mut queue = VecDeque::from([from]);
    let mut seen = BTreeSet::from([from]);
    while let Some(node) = queue.pop_front() {
        if node == to {
            let mut path = vec![to.to_string()];
            let mut at = to;
            while let Some(&prev) = parent.get(at) {
                path.push(prev.to_string());
                at = prev;
            }
            path.reverse();
            return Some(path);
        }
        for next in graph.get(node).into_iter().flatten() {
            if seen.insert(next.as_str()) {
                parent.insert(next.as_str(), node);
                queue.push_back(next.as_str());
            }
        }
    }
    None
}

/// `a -> b -> a` for the circle `[a, b]`.
fn cycle_path(cycle: &[String]) -> String {
    let mut parts = cycle.to_vec();
    parts.extend(cycle.first().cloned());
    parts.join(" -> ")
}

// ---------------------------------------------------------------------------------------------
// Reading Rust, just enough.
// ---------------------------------------------------------------------------------------------

fn is_ident(byte: u8) -> bool {
    byte.is_ascii_alphanumeric() || byte == b'_' || byte >= 0x80
}

/// `src` with every comment (doc comments too), string and character literal blanked out with
/// spaces; newlines (so line numbers) and every other byte stay where they were.
fn code_only(src: &str) -> String {
    let bytes = src.as_bytes();
    let mut out = bytes.to_vec();
    let mut i = 0;
    while i < bytes.len() {
        let token_start = i == 0 || !is_ident(bytes[i - 1]);
        let end = match bytes[i] {
            b'/' if bytes.get(i + 1) == Some(&b'/') => bytes[i..]
                .iter()
                .position(|&byte| byte == b'\n')
                .map_or(bytes.len(), |n| i + n),
            b'/' if bytes.get(i + 1) == Some(&b'*') => block_comment_end(bytes, i),
            b'"' => string_end(bytes, i + 1),
            b'\'' => char_end(bytes, i).unwrap_or(i + 1),
            b'r' | b'b' if token_start => raw_string_end(bytes, i).unwrap_or(i + 1),
            _ => i + 1,
        };
        if end > i + 1 {
            blank(&mut out, i, end);
        }
        i = end;
    }
    String::from_utf8(out).expect("tidy: blanking kept UTF-8")
}

fn blank(out: &mut [u8], from: usize, to: usize) {
    let to = to.min(out.len());
    for byte in &mut out[from..to] {
        if *byte != b'\n' {
            *byte = b' ';
        }
    }
}

/// Where the (possibly nested) block comment that opens at `start` ends.
fn block_comment_end(bytes: &[u8], start: usize) -> usize {
    let mut depth = 0;
    let mut i = start;
    while i < bytes.len() {
        if bytes[i..].starts_with(b"/*") {
            depth += 1;
            i += 2;
        } else if bytes[i..].starts_with(b"*/") {
            depth -= 1;
            i += 2;
            if depth == 0 {
                return i;
            }
        } else {
            i += 1;
        }
    }
    bytes.len()
}

/// Where the string whose contents start at `i` ends (just past its closing quote).
fn string_end(bytes: &[u8], mut i: usize) -> usize {
    while i < bytes.len() {
        match bytes[i] {
            b'\\' => i += 2,
            b'"' => return i + 1,
            _ => i += 1,
        }
    }
    bytes.len()
}

/// Where the character literal at `start` ends, or `None` if the quote opens a lifetime.
fn char_end(bytes: &[u8], start: usize) -> Option<usize> {
    let next = *bytes.get(start + 1)?;
    if next == b'\\' {
        let close = bytes.get(start + 3..)?.iter().position(|&byte| byte == b'\'')?;
        return Some(start + 3 + close + 1);
    }
    let width = match next {
        0x00..=0x7f => 1,
        0xc0..=0xdf => 2,
        0xe0..=0xef => 3,
        _ => 4,
    };
    (bytes.get(start + 1 + width) == Some(&b'\'')).then_some(start + 2 + width)
}

/// Where the raw string (`r"…"`, `r#"…"#`, `br#"…"#`) at `start` ends, if one starts there.
fn raw_string_end(bytes: &[u8], start: usize) -> Option<usize> {
    let r = if bytes[start] == b'b' { start + 1 } else { start };
    if bytes.get(r) != Some(&b'r') {
        return None;
    }
    let hashes = bytes[r + 1..].iter().take_while(|&&byte| byte == b'#').count();
    let open = r + 1 + hashes;
    if bytes.get(open) != Some(&b'"') {
        return None;
    }
    let mut close = b"\"".to_vec();
    close.extend(std::iter::repeat_n(b'#', hashes));
    let body = open + 1;
    let at = bytes[body..]
        .windows(close.len())
        .position(|window| window == close.as_slice());
    Some(at.map_or(bytes.len(), |at| body + at + close.len()))
}

/// `code` (comments and strings already blank) with each item under `#[cfg(test)]` blanked:
/// from the attribute to the `;` or the matching `}` that ends the item.
fn without_test_items(code: &str) -> String {
    const ATTRIBUTE: &str = "#[cfg(test)]";
    let bytes = code.as_bytes();
    let mut out = bytes.to_vec();
    let mut from = 0;
    while let Some(found) = code[from..].find(ATTRIBUTE) {
        let start = from + found;
        let end = item_end(bytes, start + ATTRIBUTE.len());
        blank(&mut out, start, end);
        from = end;
    }
    String::from_utf8(out).expect("tidy: blanking kept UTF-8")
}

/// Where the item that starts at `i` (after its attributes, which are skipped) ends.
fn item_end(bytes: &[u8], mut i: usize) -> usize {
    let mut nesting = 0i32;
    while i < bytes.len() {
        match bytes[i] {
            b'(' | b'[' => nesting += 1,
            b')' | b']' => nesting -= 1,
            b';' if nesting == 0 => return i + 1,
            b'{' if nesting == 0 => {
                let mut depth = 0;
                while i < bytes.len() {
                    match bytes[i] {
                        b'{' => depth += 1,
                        b'}' => {
                            depth -= 1;
                            if depth == 0 {
                                return i + 1;
                            }
                        }
                        _ => {}
                    }
                    i += 1;
                }
                return bytes.len();
            }
            _ => {}
        }
        i += 1;
    }
    bytes.len()
}

/// The first segment of every `crate::` path in `code` (already [`code_only`]), with the line
/// it is on: `crate::a::b` gives `a`; `crate::{a, b::{c, d}}` gives `a` and `b`. `self`,
/// `super` and globs are skipped, and so are `pub(crate)` and `$crate`.
fn crate_paths(code: &str) -> Vec<(usize, String)> {
    let bytes = code.as_bytes();
    let mut found = Vec::new();
    let mut from = 0;
    while let Some(at) = code[from..].find("crate").map(|at| from + at) {
        from = at + "crate".len();
        if at > 0 && (is_ident(bytes[at - 1]) || bytes[at - 1] == b'$') {
            continue;
        }
        if bytes.get(from).is_some_and(|&byte| is_ident(byte)) {
            continue;
        }
        let i = skip_space(bytes, from);
        if !bytes[i..].starts_with(b"::") {
            continue;
        }
        let i = skip_space(bytes, i + 2);
        if bytes.get(i) == Some(&b'{') {
            group_heads(bytes, i + 1, &mut found);
        } else {
            push_segment(bytes, i, &mut found);
        }
    }
    found
}

/// Adds the first segment of each path in the `{…}` group whose contents start at `i`.
fn group_heads(bytes: &[u8], mut i: usize, found: &mut Vec<(usize, String)>) {
    loop {
        i = skip_space(bytes, i);
        if bytes.get(i).is_none_or(|&byte| byte == b'}') {
            return;
        }
        push_segment(bytes, i, found);
        // On to the `,` that ends this path, past any group nested in it.
        let mut depth = 0;
        loop {
            match bytes.get(i) {
                None => return,
                Some(b'{') => depth += 1,
                Some(b'}') if depth == 0 => return,
                Some(b'}') => depth -= 1,
                Some(b',') if depth == 0 => break,
                Some(_) => {}
            }
            i += 1;
        }
        i += 1;
    }
}

fn push_segment(bytes: &[u8], i: usize, found: &mut Vec<(usize, String)>) {
    let len = bytes[i.min(bytes.len())..]
        .iter()
        .take_while(|&&byte| is_ident(byte))
        .count();
    if len == 0 {
        return;
    }
    let name = String::from_utf8_lossy(&bytes[i..i + len]).into_owned();
    if name != "self" && name != "super" {
        let line = bytes[..i].iter().filter(|&&byte| byte == b'\n').count() + 1;
        found.push((line, name));
    }
}

fn skip_space(bytes: &[u8], i: usize) -> usize {
    i + bytes[i.min(bytes.len())..]
        .iter()
        .take_while(|byte| byte.is_ascii_whitespace())
        .count()
}

// ---------------------------------------------------------------------------------------------
// The dependency graph.
// ---------------------------------------------------------------------------------------------

/// For each pure workspace crate and each IO crate it reaches through normal dependencies, the
/// shortest chain of crate names from the one to the other.
fn io_paths(metadata: &Value) -> Vec<Vec<String>> {
    let packages = metadata["packages"]
        .as_array()
        .expect("tidy: `cargo metadata` has no packages");
    let name_of = packages
        .iter()
        .map(|package| {
            (
                package["id"].as_str().unwrap_or_default(),
                package["name"].as_str().unwrap_or_default(),
            )
        })
        .collect::<BTreeMap<_, _>>();
    let members = metadata["workspace_members"]
        .as_array()
        .expect("tidy: `cargo metadata` has no workspace_members")
        .iter()
        .filter_map(Value::as_str)
        .collect::<BTreeSet<_>>();
    let nodes = metadata["resolve"]["nodes"]
        .as_array()
        .expect("tidy: `cargo metadata` has no resolve graph");
    let mut normal_deps = BTreeMap::<&str, Vec<&str>>::new();
    for node in nodes {
        let id = node["id"].as_str().expect("tidy: a resolve node without an id");
        let deps = node["deps"].as_array().expect("tidy: a resolve node without deps");
        let normal = deps
            .iter()
            .filter(|dep| {
                let kinds = dep["dep_kinds"]
                    .as_array()
                    .expect("tidy: a dependency without dep_kinds (cargo too old?)");
                kinds.iter().any(|kind| kind["kind"].is_null())
            })
            .filter_map(|dep| dep["pkg"].as_str());
        normal_deps.insert(id, normal.collect());
    }

    let mut paths = Vec::new();
    for &pure in PURE_CRATES {
        let Some(&start) = members.iter().find(|&&id| name_of.get(id) == Some(&pure)) else {
            panic!("tidy: `{pure}` is not a workspace member any more; update PURE_CRATES in tidy.rs");
        };
        let mut parent = BTreeMap::<&str, &str>::new();
        let mut queue = VecDeque::from([start]);
        let mut seen = BTreeSet::from([start]);
        while let Some(id) = queue.pop_front() {
            if IO_CRATES.contains(name_of.get(id).unwrap_or(&"")) {
                let mut path = vec![id];
                while let Some(&prev) = parent.get(path[path.len() - 1]) {
                    path.push(prev);
                }
                paths.push(
                    path.iter()
                        .rev()
                        .map(|id| name_of.get(id).unwrap_or(id).to_string())
                        .collect(),
                );
                continue;
            }
            for &dep in normal_deps.get(id).into_iter().flatten() {
                if seen.insert(dep) {
                    parent.insert(dep, id);
                    queue.push_back(dep);
                }
            }
        }
    }
    paths
}
