//! The house rules of docs/architecture.md ("Crates", "Rooms"), checked against the
//! sources: crates stand on floors and depend only downwards (tests reach upwards only
//! through `locus-testkit`, the fixture floor); inside a crate, files import one way
//! (a file may use what its parent module, `lib.rs` or `mod.rs`, defines) except for
//! the circles named in [`INHERENT_CIRCLES`]; no source file is longer than
//! 700 lines unless its first lines say why; and the plain server builds no SQL engine.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..").canonicalize().unwrap()
}

/// Each crate's floor: a crate depends only on crates of lower floors.
const FLOORS: &[(&str, u32)] = &[
    ("locus-proto", 0),
    ("locus-fuse", 0),
    ("locus-store", 1),
    ("locus-cluster", 1),
    ("locus-client", 1),
    ("locus-script", 1),
    ("locus-storelet", 1),
    ("locus-server", 2),
    ("locus-drivers", 2),
    ("locus-console", 3),
    ("locus-s3", 3),
    ("locus-mount", 3),
    ("locus-agent", 4),
    ("locus-python", 4),
    ("locus-testkit", 5),
    ("locus-bench", 6),
    ("locus-cli", 7),
];

/// Circles between files that are one type's methods split by concern across rooms
/// (each said in the crate's docs where it is): crate, then the files of the circle.
const INHERENT_CIRCLES: &[(&str, &[&str])] = &[];

fn floor(name: &str) -> u32 {
    FLOORS.iter().find(|(n, _)| *n == name).unwrap_or_else(|| panic!("{name} has no floor in this test")).1
}

/// The `locus-*` names in one section of a Cargo.toml.
fn section_deps(toml: &str, section: &str) -> Vec<String> {
    let mut inside = false;
    let mut out = Vec::new();
    for line in toml.lines() {
        let line = line.trim();
        if line.starts_with('[') {
            inside = line == section;
            continue;
        }
        if inside && line.starts_with("locus-") {
            let name: String = line.chars().take_while(|c| c.is_alphanumeric() || *c == '-').collect();
            out.push(name);
        }
    }
    out
}

fn crates() -> Vec<(String, PathBuf)> {
    let out = all_crates();
    assert!(out.len() >= 15, "the workspace's crates are found: {out:?}");
    out
}

fn all_crates() -> Vec<(String, PathBuf)> {
    let mut out: Vec<_> = std::fs::read_dir(workspace().join("crates"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.join("Cargo.toml").is_file())
        .map(|p| (p.file_name().unwrap().to_string_lossy().into_owned(), p))
        .collect();
    out.sort();
    out
}

#[test]
fn crates_depend_only_downwards_and_tests_reach_up_only_through_the_testkit() {
    let mut wrong = Vec::new();
    for (name, dir) in crates() {
        let toml = std::fs::read_to_string(dir.join("Cargo.toml")).unwrap();
        let mine = floor(&name);
        for dep in section_deps(&toml, "[dependencies]") {
            if floor(&dep) >= mine {
                wrong.push(format!("{name} (floor {mine}) depends on {dep} (floor {})", floor(&dep)));
            }
        }
        for dep in section_deps(&toml, "[dev-dependencies]") {
            if floor(&dep) >= mine && dep != "locus-testkit" {
                wrong.push(format!("{name} (floor {mine}) dev-depends on {dep} (floor {})", floor(&dep)));
            }
        }
    }
    assert!(wrong.is_empty(), "dependencies running up:\n{}", wrong.join("\n"));
}

/// A source with comments, string and char literals blanked (so a path in a doc line
/// or a message is not an import).
fn code_only(text: &str) -> String {
    let b = text.as_bytes();
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'/' && b.get(i + 1) == Some(&b'/') {
            while i < b.len() && b[i] != b'\n' {
                i += 1;
            }
        } else if b[i] == b'/' && b.get(i + 1) == Some(&b'*') {
            let end = text[i + 2..].find("*/").map_or(b.len(), |e| i + 2 + e + 2);
            i = end;
        } else if b[i] == b'r' && (b.get(i + 1) == Some(&b'"') || b.get(i + 1) == Some(&b'#')) && !prev_ident(b, i) {
            let hashes = b[i + 1..].iter().take_while(|&&c| c == b'#').count();
            if b.get(i + 1 + hashes) != Some(&b'"') {
                out.push('r');
                i += 1;
                continue;
            }
            let close = format!("\"{}", "#".repeat(hashes));
            let start = i + 2 + hashes;
            i = text[start..].find(&close).map_or(b.len(), |e| start + e + close.len());
            out.push_str("\"\"");
        } else if b[i] == b'"' {
            i += 1;
            while i < b.len() && b[i] != b'"' {
                i += if b[i] == b'\\' { 2 } else { 1 };
            }
            i += 1;
            out.push_str("\"\"");
        } else if b[i] == b'\'' && b.get(i + 2) == Some(&b'\'') {
            i += 3;
            out.push_str("' '");
        } else if b[i] == b'\'' && b.get(i + 1) == Some(&b'\\') {
            let end = text[i + 2..].find('\'').map_or(b.len(), |e| i + 2 + e + 1);
            i = end;
            out.push_str("' '");
        } else {
            let ch = text[i..].chars().next().unwrap();
            out.push(ch);
            i += ch.len_utf8();
        }
    }
    out
}

fn prev_ident(b: &[u8], i: usize) -> bool {
    i > 0 && (b[i - 1].is_ascii_alphanumeric() || b[i - 1] == b'_')
}

/// Every path a file names: the trees of its `use` items expanded, and the
/// `crate::`/`super::`/`self::` paths in the rest of its code.
fn named_paths(code: &str) -> Vec<Vec<String>> {
    let (items, body) = use_items(code);
    paths_in(&items, &body)
}

/// [`named_paths`] of a file already split into its `use` items and the rest.
fn paths_in(items: &[(Vec<String>, String)], body: &str) -> Vec<Vec<String>> {
    let mut out: Vec<Vec<String>> = items.iter().map(|(p, _)| p.clone()).collect();
    for prefix in ["crate::", "super::", "self::"] {
        let mut from = 0;
        while let Some(at) = body[from..].find(prefix) {
            let start = from + at;
            from = start + prefix.len();
            if prev_ident(body.as_bytes(), start) {
                continue;
            }
            let tail: String =
                body[start..].chars().take_while(|c| c.is_alphanumeric() || *c == '_' || *c == ':').collect();
            out.push(tail.split("::").filter(|s| !s.is_empty()).map(str::to_string).collect());
        }
    }
    out
}

fn find_word(s: &str, word: &str) -> Option<usize> {
    let mut from = 0;
    while let Some(at) = s[from..].find(word) {
        let i = from + at;
        let b = s.as_bytes();
        let before_ok = i == 0 || !(b[i - 1].is_ascii_alphanumeric() || b[i - 1] == b'_');
        let after_ok = b.get(i + word.len()).is_some_and(|c| c.is_ascii_whitespace());
        if before_ok && after_ok {
            return Some(i);
        }
        from = i + word.len();
    }
    None
}

/// Expands `a::b::{c, d::{e, f as g}}` beneath `base` into whole paths, each with the
/// name it is bound to (`g` for `f as g`, `d` for `d::{self}`, `*` for a glob).
fn expand(base: &[String], tree: &str, out: &mut Vec<(Vec<String>, String)>) {
    let tree = tree.trim();
    if tree.is_empty() {
        return;
    }
    match tree.find('{') {
        None => {
            let mut parts = tree.split(" as ");
            let path = parts.next().unwrap().trim();
            let mut whole = base.to_vec();
            whole.extend(path.split("::").map(|s| s.trim().to_string()).filter(|s| !s.is_empty()));
            if whole.last().map(String::as_str) == Some("self") {
                whole.pop();
            }
            let name = parts.next().map(|a| a.trim().to_string()).or_else(|| whole.last().cloned());
            out.push((whole, name.unwrap_or_default()));
        }
        Some(open) => {
            let mut whole = base.to_vec();
            whole.extend(tree[..open].split("::").map(|s| s.trim().to_string()).filter(|s| !s.is_empty()));
            let inner = &tree[open + 1..tree.rfind('}').unwrap_or(tree.len())];
            let mut depth = 0;
            let mut start = 0;
            for (i, c) in inner.char_indices() {
                match c {
                    '{' => depth += 1,
                    '}' => depth -= 1,
                    ',' if depth == 0 => {
                        expand(&whole, &inner[start..i], out);
                        start = i + 1;
                    }
                    _ => {}
                }
            }
            expand(&whole, &inner[start..], out);
        }
    }
}

/// A file's `use` items (path and bound name), and its code with them blanked out.
fn use_items(code: &str) -> (Vec<(Vec<String>, String)>, String) {
    let mut items = Vec::new();
    let mut body = String::with_capacity(code.len());
    let mut rest = code;
    while let Some(at) = find_word(rest, "use") {
        let after = &rest[at + 3..];
        let Some(end) = after.find(';') else { break };
        expand(&[], after[..end].trim(), &mut items);
        body.push_str(&rest[..at]);
        rest = &after[end..];
    }
    body.push_str(rest);
    (items, body)
}

/// The names a file's own items define (`fn`, `struct`, `enum`, `mod`, ...).
fn defined_names(code: &str) -> BTreeSet<String> {
    const DEFINERS: &[&str] = &["fn", "struct", "enum", "union", "const", "static", "type", "trait", "mod"];
    let tokens: Vec<&str> =
        code.split(|c: char| !(c.is_alphanumeric() || c == '_')).filter(|t| !t.is_empty()).collect();
    tokens.windows(2).filter(|w| DEFINERS.contains(&w[0])).map(|w| w[1].to_string()).collect()
}

/// The files of a crate's library, by module path (`[]` is the root).
fn modules(src: &Path) -> BTreeMap<Vec<String>, PathBuf> {
    fn walk(dir: &Path, prefix: &[String], out: &mut BTreeMap<Vec<String>, PathBuf>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            let name = path.file_stem().unwrap().to_string_lossy().into_owned();
            if path.is_dir() {
                let mut p = prefix.to_vec();
                p.push(name);
                walk(&path, &p, out);
            } else if path.extension().is_some_and(|e| e == "rs") {
                let mut p = prefix.to_vec();
                if !(prefix.is_empty() && (name == "lib" || name == "main")) && name != "mod" {
                    p.push(name);
                }
                out.insert(p, path);
            }
        }
    }
    let mut out = BTreeMap::new();
    walk(src, &[], &mut out);
    out.retain(|_, p| !p.strip_prefix(src).unwrap().components().any(|c| c.as_os_str() == "bin"));
    out
}

/// A path as a file of module `me` names it, made absolute (`None`: another crate's).
fn absolute(me: &[String], named: &[String], mods: &BTreeMap<Vec<String>, PathBuf>) -> Option<Vec<String>> {
    let mut out = match named.first().map(String::as_str) {
        Some("crate") => named[1..].to_vec(),
        Some("super") => {
            let ups = named.iter().take_while(|s| *s == "super").count();
            let mut here = me.to_vec();
            here.truncate(here.len().saturating_sub(ups));
            here.extend(named[ups..].iter().cloned());
            here
        }
        Some("self") => me.iter().chain(&named[1..]).cloned().collect(),
        // `use child::Item` in a module names its own child module.
        Some(first) if mods.contains_key(&me.iter().cloned().chain([first.to_string()]).collect::<Vec<_>>()) => {
            me.iter().chain(named).cloned().collect()
        }
        _ => return None,
    };
    if matches!(out.last().map(String::as_str), Some("self" | "*")) {
        out.pop();
    }
    Some(out)
}

/// The source of a module file as the checker reads it: code only, without its unit
/// tests (which may use anything).
fn code_of(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap();
    let text = text.split("#[cfg(test)]\nmod tests").next().unwrap();
    code_only(text)
}

/// What the checker knows of one module file: the names it imports and what they stand
/// for (its `use` items, `pub` or not), the modules it imports whole (globs), and the
/// names its own items define.
#[derive(Default)]
struct Module {
    /// Every path the file names, made absolute.
    names: Vec<Vec<String>>,
    uses: BTreeMap<String, Vec<String>>,
    globs: Vec<Vec<String>>,
    defines: BTreeSet<String>,
}

fn read_modules(mods: &BTreeMap<Vec<String>, PathBuf>) -> BTreeMap<Vec<String>, Module> {
    let mut out = BTreeMap::new();
    for (me, path) in mods {
        let code = code_of(path);
        let (items, body) = use_items(&code);
        let names = paths_in(&items, &body).iter().filter_map(|n| absolute(me, n, mods)).collect();
        let mut module = Module { names, defines: defined_names(&body), ..Module::default() };
        for (named, name) in items {
            let Some(abs) = absolute(me, &named, mods) else { continue };
            match name.as_str() {
                "*" => module.globs.push(abs),
                "_" | "" => {}
                _ => drop(module.uses.insert(name, abs)),
            }
        }
        out.insert(me.clone(), module);
    }
    out
}

/// The file that defines what `path` names, following re-exports and globs: the last
/// file reached if they loop.
fn defining_file(path: Vec<String>, mods: &BTreeMap<Vec<String>, Module>) -> Option<Vec<String>> {
    let mut path = path;
    let mut last = None;
    'follow: for _ in 0..16 {
        let file = (0..=path.len()).rev().map(|n| path[..n].to_vec()).find(|p| mods.contains_key(p))?;
        last = Some(file.clone());
        let Some(name) = path.get(file.len()).cloned() else { return last };
        let module = &mods[&file];
        if module.defines.contains(&name) {
            return last;
        }
        if let Some(target) = module.uses.get(&name).filter(|t| **t != path[..=file.len()]) {
            let mut next = target.clone();
            next.extend(path[file.len() + 1..].iter().cloned());
            path = next;
            continue;
        }
        for glob in &module.globs {
            if mods.get(glob).is_some_and(|g| g.defines.contains(&name) || g.uses.contains_key(&name)) {
                let mut next = glob.clone();
                next.extend(path[file.len()..].iter().cloned());
                path = next;
                continue 'follow;
            }
        }
        return last;
    }
    last
}

/// Which files each file of a crate imports from (by module path), re-exports followed.
fn imports(src: &Path) -> BTreeMap<Vec<String>, BTreeSet<Vec<String>>> {
    let files = modules(src);
    assert!(!files.is_empty(), "{} has no modules", src.display());
    let mods = read_modules(&files);
    let mut graph = BTreeMap::new();
    for (me, module) in &mods {
        let mut deps = BTreeSet::new();
        for named in &module.names {
            if let Some(t) = defining_file(named.clone(), &mods) {
                // A file may use what its parent module (lib.rs, mod.rs) itself defines.
                if &t != me && !me.starts_with(&t) {
                    deps.insert(t);
                }
            }
        }
        graph.insert(me.clone(), deps);
    }
    graph
}

/// The strongly connected groups of more than one file (Tarjan).
fn circles(graph: &BTreeMap<Vec<String>, BTreeSet<Vec<String>>>) -> Vec<BTreeSet<Vec<String>>> {
    struct State<'a> {
        graph: &'a BTreeMap<Vec<String>, BTreeSet<Vec<String>>>,
        index: BTreeMap<&'a Vec<String>, usize>,
        low: BTreeMap<&'a Vec<String>, usize>,
        stack: Vec<&'a Vec<String>>,
        on: BTreeSet<&'a Vec<String>>,
        out: Vec<BTreeSet<Vec<String>>>,
    }
    fn visit<'a>(s: &mut State<'a>, v: &'a Vec<String>) {
        let i = s.index.len();
        s.index.insert(v, i);
        s.low.insert(v, i);
        s.stack.push(v);
        s.on.insert(v);
        for w in &s.graph[v] {
            let Some(w) = s.graph.get_key_value(w).map(|(k, _)| k) else { continue };
            if !s.index.contains_key(w) {
                visit(s, w);
                let lw = s.low[w];
                let lv = s.low.get_mut(v).unwrap();
                *lv = (*lv).min(lw);
            } else if s.on.contains(w) {
                let iw = s.index[w];
                let lv = s.low.get_mut(v).unwrap();
                *lv = (*lv).min(iw);
            }
        }
        if s.low[v] == s.index[v] {
            let mut group = BTreeSet::new();
            while let Some(w) = s.stack.pop() {
                s.on.remove(w);
                group.insert(w.clone());
                if w == v {
                    break;
                }
            }
            if group.len() > 1 {
                s.out.push(group);
            }
        }
    }
    let mut s = State {
        graph,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on: BTreeSet::new(),
        out: Vec::new(),
    };
    for v in graph.keys() {
        if !s.index.contains_key(v) {
            visit(&mut s, v);
        }
    }
    s.out
}

fn file_name(m: &[String]) -> String {
    if m.is_empty() {
        "lib".into()
    } else {
        m.join("/")
    }
}

#[test]
fn files_inside_a_crate_import_one_way_but_for_the_named_circles() {
    let mut found = Vec::new();
    let mut seen = Vec::new();
    for (name, dir) in crates() {
        let src = dir.join("src");
        let graph = imports(&src);
        for group in circles(&graph) {
            let files: BTreeSet<String> = group.iter().map(|m| file_name(m)).collect();
            let named = INHERENT_CIRCLES
                .iter()
                .any(|(c, fs)| *c == name && fs.iter().map(|f| f.to_string()).collect::<BTreeSet<_>>() == files);
            if named {
                seen.push((name.clone(), files));
            } else {
                let edges: Vec<String> = group
                    .iter()
                    .flat_map(|a| graph[a].iter().filter(|b| group.contains(*b)).map(move |b| (a, b)))
                    .map(|(a, b)| format!("{} -> {}", file_name(a), file_name(b)))
                    .collect();
                found.push(format!(
                    "{name}: {} ({})",
                    files.into_iter().collect::<Vec<_>>().join(" <-> "),
                    edges.join(", ")
                ));
            }
        }
    }
    assert!(found.is_empty(), "import circles not named as inherent:\n{}", found.join("\n"));
    for (c, fs) in INHERENT_CIRCLES {
        let files: BTreeSet<String> = fs.iter().map(|f| f.to_string()).collect();
        assert!(seen.contains(&(c.to_string(), files)), "{c}: {fs:?} is named as a circle but is none any more");
    }
}

#[test]
fn the_circle_finder_finds_a_circle_and_reads_use_trees() {
    let mut paths = Vec::new();
    expand(&[], "crate::a::{b, c::{self, D, e as f}}, ", &mut paths);
    let v = |p: &[&str], n: &str| (p.iter().map(|s| s.to_string()).collect::<Vec<_>>(), n.to_string());
    assert_eq!(
        paths,
        vec![
            v(&["crate", "a", "b"], "b"),
            v(&["crate", "a", "c"], "c"),
            v(&["crate", "a", "c", "D"], "D"),
            v(&["crate", "a", "c", "e"], "f")
        ]
    );
    let code = code_only("// use crate::x;\nlet s = \"crate::y\"; use crate::z::W; crate::q::f();");
    assert_eq!(named_paths(&code), vec![vec!["crate", "z", "W"], vec!["crate", "q", "f"]]);
    let m = |s: &str| s.split('/').map(str::to_string).collect::<Vec<_>>();
    let graph = BTreeMap::from([
        (m("a"), BTreeSet::from([m("b")])),
        (m("b"), BTreeSet::from([m("a")])),
        (m("c"), BTreeSet::from([m("a")])),
    ]);
    assert_eq!(circles(&graph), vec![BTreeSet::from([m("a"), m("b")])]);
}

#[test]
fn the_circle_finder_follows_aliases_globs_and_re_exports_through_files() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("src");
    std::fs::create_dir_all(src.join("wing")).unwrap();
    let files = [
        ("lib.rs", "mod a; mod b; mod c; mod d; mod inner; mod x; mod wing; pub use inner::*; pub use c::Thing;"),
        // a <-> b, each naming the other's `Error` under another name.
        ("a.rs", "use crate::b::Error as BError; pub enum Error { B(BError) }"),
        ("b.rs", "use crate::a::Error as AError; pub enum Error { A(AError) }"),
        // inner <-> x, x reaching inner through the root's glob re-export.
        ("inner.rs", "use crate::x::Y; pub struct Foo(Y);"),
        ("x.rs", "use crate::Foo; pub struct Y; fn f(_: Foo) {}"),
        // d -> c through the root's re-export, c -> nothing: no circle.
        ("c.rs", "pub struct Thing;"),
        ("d.rs", "use crate::{Thing, wing::{self, Part}}; fn f(_: Thing, _: Part) { wing::g() }"),
        // wing/mod.rs -> its child part.rs, part.rs -> its parent: allowed.
        ("wing/mod.rs", "mod part; pub use part::Part; pub fn g() {}"),
        ("wing/part.rs", "pub struct Part; fn h() { super::g() }"),
    ];
    for (name, text) in files {
        std::fs::write(src.join(name), text).unwrap();
    }
    let graph = imports(&src);
    let m = |s: &str| s.split('/').map(str::to_string).collect::<Vec<_>>();
    assert_eq!(graph[&m("d")], BTreeSet::from([m("c"), m("wing"), m("wing/part")]), "{graph:?}");
    let mut found = circles(&graph);
    found.sort();
    assert_eq!(found, vec![BTreeSet::from([m("a"), m("b")]), BTreeSet::from([m("inner"), m("x")])], "{graph:?}");
}

#[test]
fn no_source_file_is_over_700_lines_without_a_reason_on_its_first_lines() {
    let mut long = Vec::new();
    for (name, dir) in crates() {
        let mut stack = vec![dir.join("src"), dir.join("tests"), dir.join("examples")];
        while let Some(d) = stack.pop() {
            let Ok(entries) = std::fs::read_dir(&d) else { continue };
            for e in entries {
                let p = e.unwrap().path();
                if p.is_dir() {
                    stack.push(p);
                } else if p.extension().is_some_and(|x| x == "rs") {
                    let text = std::fs::read_to_string(&p).unwrap();
                    let lines = text.lines().count();
                    let head: String = text.lines().take(12).collect::<Vec<_>>().join("\n");
                    if lines > 700 && !head.contains("Longer than 700 lines because") {
                        long.push(format!("{name}/{}: {lines} lines", p.strip_prefix(&dir).unwrap().display()));
                    }
                }
            }
        }
    }
    assert!(long.is_empty(), "files over 700 lines without 'Longer than 700 lines because':\n{}", long.join("\n"));
}

#[test]
fn the_plain_server_builds_no_sql_engine() {
    let tree = |features: &[&str]| {
        let out = std::process::Command::new(env!("CARGO"))
            .current_dir(workspace())
            .args(["tree", "-p", "locus-server", "-e", "normal", "--prefix", "none"])
            .args(features)
            .output()
            .expect("cargo tree runs");
        assert!(out.status.success(), "cargo tree: {}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8(out.stdout).unwrap()
    };
    let plain = tree(&[]);
    assert!(plain.contains("locus-store"), "cargo tree lists the server's dependencies:\n{plain}");
    for engine in ["rusqlite", "libsqlite3-sys", "postgres", "locus-cluster"] {
        assert!(!plain.lines().any(|l| l.starts_with(engine)), "the plain server builds {engine}");
    }
    let head = tree(&["--features", "cluster"]);
    assert!(head.lines().any(|l| l.starts_with("rusqlite")), "a head's build has SQLite");
}
