//! The workspace's structure, as `docs/getting-started.md` ("Layout") describes it: crates depend on each
//! other one way only, and inside every crate modules import each other without a circle.
//!
//! A circle makes every module in it depend on all the others: none can be read, tested or
//! moved alone. The module check reads each crate's `src/` as text, collects the `crate::`,
//! `super::` and `self::` paths of every file (imports and inline paths, test modules
//! included, comments not), and fails naming the circles it finds. Modules are compared with
//! their siblings: `api::write` using `api::options` is an edge between those two, `handlers`
//! using `api::write` an edge from `handlers` to `api`; a module using its own parent or child
//! is no edge (a parent holds its children, whose `impl` blocks may name its types).
//!
//! Run `cargo test -p caretaker --test workspace_layout -- --nocapture` to see the graphs.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

type Module = Vec<String>;

/// The workspace's crates: (directory under `crates/`, package name).
fn crates() -> Vec<(String, String)> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut out = Vec::new();
    for entry in std::fs::read_dir(&root).unwrap() {
        let dir = entry.unwrap().path();
        let Ok(manifest) = std::fs::read_to_string(dir.join("Cargo.toml")) else {
            continue;
        };
        let name = section(&manifest, "package")
            .into_iter()
            .find_map(|(key, value)| (key == "name").then_some(value))
            .unwrap();
        let dir_name = dir.file_name().unwrap().to_string_lossy().into_owned();
        out.push((dir_name, name.trim_matches('"').to_string()));
    }
    out.sort();
    out
}

/// The `key = value` lines of `[name]` in a manifest (keys as written, dotted keys whole).
fn section(manifest: &str, name: &str) -> Vec<(String, String)> {
    let header = format!("[{name}]");
    manifest
        .lines()
        .skip_while(|l| l.trim() != header)
        .skip(1)
        .take_while(|l| !l.trim_start().starts_with('['))
        .filter(|l| !l.trim_start().starts_with('#'))
        .filter_map(|l| {
            let (key, value) = l.split_once('=')?;
            Some((key.trim().to_string(), value.trim().to_string()))
        })
        .collect()
}

/// The workspace crates a crate depends on to build (not its dev-dependencies).
fn depends_on(dir: &str) -> BTreeSet<String> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let manifest = std::fs::read_to_string(root.join(dir).join("Cargo.toml")).unwrap();
    section(&manifest, "dependencies")
        .into_iter()
        .map(|(key, _)| key.split('.').next().unwrap().to_string())
        .filter(|name| name.starts_with("caretaker-"))
        .collect()
}

/// The product binary links the embedded API server and the test kit only through the `demo`
/// and `apiserver` features, which the image leaves off.
#[test]
fn the_product_binary_links_no_api_server_or_test_kit_by_default() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let manifest = std::fs::read_to_string(root.join("Cargo.toml")).unwrap();
    let dependencies = section(&manifest, "dependencies");
    for name in ["caretaker-apiserver", "caretaker-testkit"] {
        let (_, value) = dependencies
            .iter()
            .find(|(key, _)| key.split('.').next() == Some(name))
            .unwrap_or_else(|| panic!("{name} is no dependency of caretaker"));
        assert!(
            value.contains("optional = true"),
            "{name} = {value}: not behind a feature"
        );
    }
    let features = section(&manifest, "features");
    assert!(
        !features.iter().any(|(key, _)| key == "default"),
        "a default feature: {features:?}"
    );
}

/// Each crate depends on exactly the crates the layout allows, so no crate reaches into one
/// above it: the API types (`caretaker-api`) are at the bottom and know no other caretaker
/// crate; the API server knows no caretaker; the agent and the operator meet only in the agent
/// API; fixtures live in the test kit, which knows the API types but not the operator, and
/// which production code other than the binary's demo never links.
#[test]
fn crates_depend_on_each_other_one_way() {
    let allowed: BTreeMap<&str, &[&str]> = BTreeMap::from([
        ("caretaker-api", &[][..]),
        ("caretaker-listener", &[][..]),
        ("caretaker-pki", &[][..]),
        (
            "caretaker-apiserver",
            &["caretaker-listener", "caretaker-pki"][..],
        ),
        ("caretaker-agent-api", &["caretaker-pki"][..]),
        (
            "caretaker-agent",
            &["caretaker-agent-api", "caretaker-listener", "caretaker-pki"][..],
        ),
        (
            "caretaker-operator",
            &[
                "caretaker-agent-api",
                "caretaker-api",
                "caretaker-listener",
                "caretaker-pki",
            ][..],
        ),
        (
            "caretaker-testkit",
            &[
                "caretaker-agent",
                "caretaker-agent-api",
                "caretaker-api",
                "caretaker-pki",
            ][..],
        ),
        (
            "caretaker",
            &[
                "caretaker-agent",
                "caretaker-agent-api",
                "caretaker-api",
                "caretaker-apiserver",
                "caretaker-operator",
                "caretaker-pki",
                "caretaker-testkit",
            ][..],
        ),
    ]);
    let crates = crates();
    let names: BTreeSet<&str> = crates.iter().map(|(_, name)| name.as_str()).collect();
    assert_eq!(
        names,
        allowed.keys().copied().collect(),
        "a crate was added or removed: give it its place here and in docs/getting-started.md's layout"
    );
    for (dir, name) in &crates {
        let expected: BTreeSet<String> = allowed[name.as_str()]
            .iter()
            .map(|s| s.to_string())
            .collect();
        assert_eq!(
            depends_on(dir),
            expected,
            "{name}'s [dependencies] on workspace crates"
        );
    }
}

/// The API types are the bottom of the house: they depend on no caretaker crate, not even in
/// their tests, and the test kit, which builds objects of those types, does not depend on the
/// operator (it did, for the names and kinds that now live in `caretaker-api`).
#[test]
fn the_api_types_are_at_the_bottom() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let api = std::fs::read_to_string(root.join("api/Cargo.toml")).unwrap();
    let everything: Vec<String> = ["dependencies", "dev-dependencies", "build-dependencies"]
        .iter()
        .flat_map(|name| section(&api, name))
        .map(|(key, _)| key)
        .filter(|key| key.starts_with("caretaker-"))
        .collect();
    assert!(
        everything.is_empty(),
        "caretaker-api depends on {everything:?}"
    );
    let testkit = std::fs::read_to_string(root.join("testkit/Cargo.toml")).unwrap();
    for name in ["dependencies", "dev-dependencies"] {
        assert!(
            !section(&testkit, name)
                .iter()
                .any(|(key, _)| key.split('.').next() == Some("caretaker-operator")),
            "caretaker-testkit's [{name}] name caretaker-operator"
        );
    }
}

#[test]
fn no_crate_has_modules_importing_each_other_in_a_circle() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut found = Vec::new();
    for (dir, name) in crates() {
        let graph = graph(&rust_files(&root.join(dir).join("src")));
        println!("{name}:");
        for (from, to) in graph.iter().filter(|(from, _)| !from.is_empty()) {
            let to: Vec<String> = to.iter().map(|m| m.join("::")).collect();
            println!("  {} -> {}", from.join("::"), to.join(", "));
        }
        found.extend(circles(&graph).into_iter().map(|c| format!("{name}: {c}")));
    }
    assert!(
        found.is_empty(),
        "modules that import each other in a circle:\n{}",
        found.join("\n")
    );
}

/// The API server's folders are its layers, bottom up: `store/` (SQLite, the registry of
/// served kinds), `schema/` (what the kinds look like, discovery, printing), `patch/` (patches
/// and server-side apply), the verbs (`admission`; `api/`, which `auth/` and `controllers`
/// use), `http/` (serving). A layer imports only the layers below it; the shared helpers (errors, metadata,
/// selectors, ...) import at most the store, and every layer may use them. Each top-level
/// module has its place here, so a new one is placed on purpose.
#[test]
fn apiserver_layers_import_only_downward() {
    let rank = |module: &str| match module {
        "store" => Some(0),
        "schema" => Some(1),
        "patch" => Some(2),
        "admission" => Some(3),
        "api" => Some(4),
        "auth" | "controllers" => Some(5),
        "http" => Some(6),
        _ => None,
    };
    let helpers = ["error", "meta", "selectors", "tls", "user", "work"];
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../apiserver/src");
    let graph = graph(&rust_files(&root));
    let mut upward = Vec::new();
    for (from, to) in graph.iter().filter(|(from, _)| from.len() == 1) {
        let from = from[0].as_str();
        assert!(
            rank(from).is_some() || helpers.contains(&from),
            "apiserver module {from} has no layer: give it one here and in its README"
        );
        for to in to {
            let allowed = match (rank(from), rank(&to[0])) {
                (Some(from), Some(to)) => to < from,
                // A helper: below every layer but the store.
                (None, Some(to)) => to == 0,
                (_, None) => true,
            };
            if !allowed {
                upward.push(format!("{from} -> {}", to[0]));
            }
        }
    }
    assert!(
        upward.is_empty(),
        "API server modules importing a layer above their own:\n{}",
        upward.join("\n")
    );
}

/// The operator's `runtime/` is the plumbing every controller shares (watches, writes on the
/// version read, status memory, the refusal sequence): it imports no feature folder and no
/// controller, which give it their kinds and steps instead, so that every feature can use it
/// without a circle. So do the other shared modules: the context, the metrics, the
/// vocabulary of changes and schedules, and the checks of spec fields (`validation`).
#[test]
fn the_operators_runtime_imports_no_feature() {
    let features = [
        "authority",
        "controllers",
        "etcd",
        "injection",
        "machine",
        "rollout",
        "trust",
        "webhook",
    ];
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../operator/src");
    let files = rust_files(&root);
    assert!(
        files.contains_key(&vec!["runtime".to_string()]),
        "the operator has a runtime/"
    );
    let modules: BTreeSet<Module> = files.keys().cloned().collect();
    let mut found = Vec::new();
    let shared = [
        "runtime",
        "context",
        "metrics",
        "validation",
        "changes",
        "schedule",
        "shutdown",
        "timestamp",
    ];
    for (module, text) in files
        .iter()
        .filter(|(m, _)| m.first().is_some_and(|top| shared.contains(&top.as_str())))
    {
        for path in paths(&code_only(text)) {
            let Some(target) = resolve(module, &path, &modules) else {
                continue;
            };
            if target
                .first()
                .is_some_and(|t| features.contains(&t.as_str()))
            {
                found.push(format!("{} -> {}", module.join("::"), target.join("::")));
            }
        }
    }
    assert!(
        found.is_empty(),
        "operator runtime modules importing a feature or a controller:\n{}",
        found.join("\n")
    );
}

/// Each feature folder of the operator holds its pure decisions and its `controller` glue; no
/// feature imports another feature's controller (a feature's pure decisions are anyone's to
/// use), so that each controller can be read and changed alone.
#[test]
fn no_operator_feature_imports_another_features_controller() {
    let features = [
        "authority",
        "etcd",
        "injection",
        "machine",
        "rollout",
        "trust",
    ];
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../operator/src");
    let files = rust_files(&root);
    let modules: BTreeSet<Module> = files.keys().cloned().collect();
    let mut found = Vec::new();
    for (module, text) in &files {
        let Some(from) = module.first().filter(|m| features.contains(&m.as_str())) else {
            continue;
        };
        for path in paths(&code_only(text)) {
            let Some(target) = resolve(module, &path, &modules) else {
                continue;
            };
            let into_controller = target.get(1).map(String::as_str) == Some("controller");
            if into_controller && target[0] != *from && features.contains(&target[0].as_str()) {
                found.push(format!("{} -> {}", module.join("::"), target.join("::")));
            }
        }
    }
    assert!(
        found.is_empty(),
        "operator features importing another feature's controller:\n{}",
        found.join("\n")
    );
}

/// The check itself finds circles: through `use` groups and inline paths, and between
/// siblings in a folder, but not between a parent and its children.
#[test]
fn circles_are_found() {
    let tree = |files: &[(&str, &str)]| -> BTreeMap<Module, String> {
        files
            .iter()
            .map(|(m, text)| {
                let module = m.split("::").filter(|s| !s.is_empty()).map(String::from);
                (module.collect(), text.to_string())
            })
            .collect()
    };
    let top = tree(&[
        ("a", "use crate::b::X;"),
        ("b", "use crate::{c, d::Y};"),
        ("c", "// crate::d::z()\nfn f() { crate::a::g() }"),
        ("d", ""),
    ]);
    assert_eq!(circles(&graph(&top)), ["a, b, c"]);
    let nested = tree(&[
        ("api", "mod x; mod y; pub use x::X;"),
        ("api::x", "use super::ApiState; use super::y::Y;"),
        ("api::y", "use super::{ApiState, x::X};"),
    ]);
    assert_eq!(circles(&graph(&nested)), ["api::x, api::y"]);
    let layered = tree(&[
        ("api", "mod x; mod y; pub use x::X;"),
        ("api::x", "use super::ApiState; use super::y::Y;"),
        ("api::y", "use super::ApiState;"),
    ]);
    assert!(circles(&graph(&layered)).is_empty());
}

/// Which module uses which, between siblings (see the header).
fn graph(files: &BTreeMap<Module, String>) -> BTreeMap<Module, BTreeSet<Module>> {
    let modules: BTreeSet<Module> = files.keys().cloned().collect();
    let mut graph: BTreeMap<Module, BTreeSet<Module>> = BTreeMap::new();
    for (module, text) in files {
        graph.entry(module.clone()).or_default();
        for path in paths(&code_only(text)) {
            let Some(target) = resolve(module, &path, &modules) else {
                continue;
            };
            if let Some((from, to)) = sibling_edge(module, &target) {
                graph.entry(from).or_default().insert(to);
            }
        }
    }
    graph
}

/// The circles in `graph`, each as its modules' names.
fn circles(graph: &BTreeMap<Module, BTreeSet<Module>>) -> Vec<String> {
    strongly_connected(graph)
        .into_iter()
        .filter(|c| c.len() > 1)
        .map(|c| {
            let names: Vec<String> = c.iter().map(|m| m.join("::")).collect();
            names.join(", ")
        })
        .collect()
}

/// Every `.rs` file below `dir`, by the module it is: `api/mod.rs` is `api`, `api/write.rs`
/// `api::write`, `lib.rs` the crate root (the empty path).
fn rust_files(dir: &Path) -> BTreeMap<Module, String> {
    let mut out = BTreeMap::new();
    let mut pending = vec![(dir.to_path_buf(), Vec::<String>::new())];
    while let Some((dir, prefix)) = pending.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            let name = path.file_name().unwrap().to_string_lossy().into_owned();
            if path.is_dir() {
                pending.push((path, [prefix.clone(), vec![name]].concat()));
            } else if let Some(stem) = name.strip_suffix(".rs") {
                let module = match stem {
                    "mod" | "lib" | "main" => prefix.clone(),
                    _ => [prefix.clone(), vec![stem.to_string()]].concat(),
                };
                out.insert(module, std::fs::read_to_string(&path).unwrap());
            }
        }
    }
    out
}

/// The text without comment lines (doc links such as [`crate::x`] are no imports).
fn code_only(text: &str) -> String {
    text.lines()
        .filter(|l| !l.trim_start().starts_with("//"))
        .collect::<Vec<_>>()
        .join("\n")
}

/// Every path that starts at `crate`, `super` or `self`, with `use` groups spread out:
/// `use crate::{a, b::{c, d}}` gives `crate::a`, `crate::b::c`, `crate::b::d`.
fn paths(code: &str) -> Vec<Vec<String>> {
    let chars: Vec<char> = code.chars().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        let starts_word = i == 0 || !is_ident(chars[i - 1]);
        if starts_word && chars[i].is_alphabetic() {
            let (word, end) = ident(&chars, i);
            if matches!(word.as_str(), "crate" | "super" | "self") && at(&chars, end, "::") {
                let mut p = Parser { chars: &chars, i };
                p.tree(Vec::new(), &mut out);
                i = p.i.max(end);
                continue;
            }
            i = end;
            continue;
        }
        i += 1;
    }
    out
}

struct Parser<'a> {
    chars: &'a [char],
    i: usize,
}

impl Parser<'_> {
    fn skip_space(&mut self) {
        while self.i < self.chars.len() && self.chars[self.i].is_whitespace() {
            self.i += 1;
        }
    }

    /// One use tree after `prefix`: `a::b`, `a::{..}`, `a::*`.
    fn tree(&mut self, mut prefix: Vec<String>, out: &mut Vec<Vec<String>>) {
        loop {
            self.skip_space();
            match self.chars.get(self.i) {
                Some('{') => {
                    self.i += 1;
                    loop {
                        self.skip_space();
                        match self.chars.get(self.i) {
                            Some('}') => {
                                self.i += 1;
                                return;
                            }
                            Some(',') => self.i += 1,
                            Some(_) => {
                                let before = self.i;
                                self.tree(prefix.clone(), out);
                                if self.i == before {
                                    self.i += 1;
                                }
                            }
                            None => return,
                        }
                    }
                }
                Some(c) if c.is_alphabetic() || *c == '_' => {
                    let (word, end) = ident(self.chars, self.i);
                    self.i = end;
                    prefix.push(word);
                    self.skip_space();
                    if at(self.chars, self.i, "::") {
                        self.i += 2;
                        continue;
                    }
                    out.push(prefix);
                    return;
                }
                // `*`, or the end of a path in an expression (`(`, `<`, `;`).
                _ => {
                    out.push(prefix);
                    return;
                }
            }
        }
    }
}

fn is_ident(c: char) -> bool {
    c.is_alphanumeric() || c == '_'
}

fn ident(chars: &[char], start: usize) -> (String, usize) {
    let mut end = start;
    while end < chars.len() && is_ident(chars[end]) {
        end += 1;
    }
    (chars[start..end].iter().collect(), end)
}

fn at(chars: &[char], i: usize, s: &str) -> bool {
    s.chars()
        .enumerate()
        .all(|(k, c)| chars.get(i + k) == Some(&c))
}

/// The module a path written in `from` lands in: the longest known module it names.
fn resolve(from: &Module, path: &[String], modules: &BTreeSet<Module>) -> Option<Module> {
    let mut base: Module = Vec::new();
    let mut rest = path;
    match rest.first().map(String::as_str) {
        Some("crate") => rest = &rest[1..],
        Some("self" | "super") => {
            base = from.clone();
            while rest.first().map(String::as_str) == Some("self") {
                rest = &rest[1..];
            }
            while rest.first().map(String::as_str) == Some("super") {
                base.pop()?;
                rest = &rest[1..];
            }
        }
        _ => return None,
    }
    let mut found = base.clone();
    for segment in rest {
        let mut next = found.clone();
        next.push(segment.clone());
        if !modules.contains(&next) {
            break;
        }
        found = next;
    }
    Some(found)
}

/// The edge a use from `from` to `to` makes between siblings: the children of their closest
/// common ancestor that hold each. None when one contains the other.
fn sibling_edge(from: &Module, to: &Module) -> Option<(Module, Module)> {
    let common = from.iter().zip(to).take_while(|(a, b)| a == b).count();
    if common == from.len() || common == to.len() {
        return None;
    }
    Some((from[..=common].to_vec(), to[..=common].to_vec()))
}

/// Tarjan's strongly connected components: each circle of modules comes out as one component.
fn strongly_connected(graph: &BTreeMap<Module, BTreeSet<Module>>) -> Vec<Vec<Module>> {
    struct State<'g> {
        graph: &'g BTreeMap<Module, BTreeSet<Module>>,
        index: BTreeMap<&'g Module, usize>,
        low: BTreeMap<&'g Module, usize>,
        stack: Vec<&'g Module>,
        on_stack: BTreeSet<&'g Module>,
        out: Vec<Vec<Module>>,
    }
    fn visit<'g>(s: &mut State<'g>, v: &'g Module) {
        let n = s.index.len();
        s.index.insert(v, n);
        s.low.insert(v, n);
        s.stack.push(v);
        s.on_stack.insert(v);
        for w in s.graph.get(v).into_iter().flatten() {
            if !s.index.contains_key(w) {
                visit(s, w);
                let low = s.low[v].min(s.low[w]);
                s.low.insert(v, low);
            } else if s.on_stack.contains(w) {
                let low = s.low[v].min(s.index[w]);
                s.low.insert(v, low);
            }
        }
        if s.low[v] == s.index[v] {
            let mut component = Vec::new();
            while let Some(w) = s.stack.pop() {
                s.on_stack.remove(w);
                component.push(w.clone());
                if w == v {
                    break;
                }
            }
            component.sort();
            s.out.push(component);
        }
    }
    let mut s = State {
        graph,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on_stack: BTreeSet::new(),
        out: Vec::new(),
    };
    for v in graph.keys() {
        if !s.index.contains_key(v) {
            visit(&mut s, v);
        }
    }
    s.out
}
