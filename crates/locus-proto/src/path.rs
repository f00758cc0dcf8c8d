//! Remote paths, one rule for every door: a path names something under the export root
//! as `/a/b`, whatever slashes and `.` it came with; `..` and NUL are never part of one.
//! The server's callbacks, the cluster's namespace, the mount and the drivers all take
//! paths apart and put them together here.

/// The canonical form of `path`: absolute, no empty or `.` components, `/` for the root;
/// none if a component is `..` or holds a NUL (what no door lets through).
pub fn canonical(path: &str) -> Option<String> {
    let mut out = String::with_capacity(path.len() + 1);
    for part in path.split('/').filter(|p| !p.is_empty() && *p != ".") {
        if part == ".." || part.contains('\0') {
            return None;
        }
        out.push('/');
        out.push_str(part);
    }
    if out.is_empty() {
        out.push('/');
    }
    Some(out)
}

/// The directory and last name of a canonical path; none for `/`.
pub fn split(path: &str) -> Option<(&str, &str)> {
    let i = path.rfind('/')?;
    if path == "/" {
        return None;
    }
    Some((if i == 0 { "/" } else { &path[..i] }, &path[i + 1..]))
}

/// The directory of a canonical path (`/` is its own).
pub fn parent(path: &str) -> &str {
    split(path).map_or("/", |(dir, _)| dir)
}

/// `name` in the directory `dir` (`/` is not doubled when `dir` ends with one).
pub fn join(dir: &str, name: &str) -> String {
    if dir.ends_with('/') {
        format!("{dir}{name}")
    } else {
        format!("{dir}/{name}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_have_one_canonical_form_and_dot_dot_or_nul_has_none() {
        for (given, want) in [("/", "/"), ("", "/"), ("a", "/a"), ("//a/./b/", "/a/b"), ("/a/b", "/a/b")] {
            assert_eq!(canonical(given).as_deref(), Some(want), "{given:?}");
        }
        for refused in ["/a/../b", "..", "/a/b\0c"] {
            assert_eq!(canonical(refused), None, "{refused:?}");
        }
        assert_eq!(split("/a/b"), Some(("/a", "b")));
        assert_eq!(split("/a"), Some(("/", "a")));
        assert_eq!(split("/"), None);
        assert_eq!((parent("/a/b"), parent("/a"), parent("/")), ("/a", "/", "/"));
        assert_eq!((join("/", "a"), join("/a", "b")), ("/a".to_string(), "/a/b".to_string()));
    }
}
