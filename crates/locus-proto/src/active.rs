//! Names that invoke active-file handlers (Lerna): looking up a missing name of one of
//! these forms runs the registered handler it names, and its output becomes the file.
//!
//! - **Lerna's form**: a command line, URL-encoded (`+` or `%20` for spaces, `%2F` for
//!   slashes): `%2Fusr%2Fbin%2Fshp2img+-m+foo.map` runs the handler `shp2img` with
//!   arguments `-m foo.map`. The handler is the program's base name.
//! - **The short form**: `HANDLER@ARG,ARG,...`, which shells and Makefiles write without
//!   quoting: `csv@sales.csv,-sum,price`. Each argument is percent-decoded, so `%2C` is a
//!   comma and `%2F` a slash inside one.
//!
//! Either form with `.err` appended names the error record of the invocation's last
//! failed run. The name forms are part of the protocol so that clients which cache
//! absent names (the mount, the agent) never treat a possible invocation as absent.

/// Longest handler name.
pub const MAX_HANDLER_NAME: usize = 64;
/// Most arguments an invocation may carry.
pub const MAX_ARGS: usize = 64;
/// Suffix naming an invocation's error record.
pub const ERR_SUFFIX: &str = ".err";

/// A decoded invocation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Invocation {
    /// The registered handler it names.
    pub handler: String,
    /// Its arguments, in order.
    pub args: Vec<String>,
    /// The name asks for the error record (`NAME.err`), not for the output.
    pub error_record: bool,
}

/// True for a name a handler may have: letters, digits, `_`, `-` and `.`, not leading.
pub fn valid_handler_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= MAX_HANDLER_NAME
        && !name.starts_with('.')
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.'))
}

/// True when `name` has the shape of an invocation (whatever handlers exist): such a
/// name must be asked of the server even when a listing says it is absent.
pub fn may_invoke(name: &str) -> bool {
    parse(name).is_some()
}

/// Decodes a file name into an invocation, or `None` for an ordinary name.
pub fn parse(name: &str) -> Option<Invocation> {
    if let Some(stem) = name.strip_suffix(ERR_SUFFIX) {
        if let Some(mut inv) = parse_output(stem) {
            inv.error_record = true;
            return Some(inv);
        }
    }
    parse_output(name)
}

fn parse_output(name: &str) -> Option<Invocation> {
    if let Some((handler, rest)) = name.split_once('@') {
        if valid_handler_name(handler) {
            let args =
                if rest.is_empty() { Vec::new() } else { rest.split(',').map(decode).collect::<Option<Vec<_>>>()? };
            return finish(handler.to_string(), args);
        }
    }
    if !name.contains(['%', '+']) {
        return None;
    }
    let line = decode(&name.replace('+', " "))?;
    let mut words = line.split_ascii_whitespace();
    let program = words.next()?;
    let handler = program.rsplit('/').next().unwrap_or(program);
    if !valid_handler_name(handler) {
        return None;
    }
    finish(handler.to_string(), words.map(str::to_string).collect())
}

fn finish(handler: String, args: Vec<String>) -> Option<Invocation> {
    (args.len() <= MAX_ARGS && args.iter().all(|a| !a.contains('\0'))).then_some(Invocation {
        handler,
        args,
        error_record: false,
    })
}

/// Percent-decodes one piece; `None` when the result is not UTF-8.
fn decode(s: &str) -> Option<String> {
    percent_encoding::percent_decode_str(s).decode_utf8().ok().map(|c| c.into_owned())
}

/// The Lerna form of a command line (the inverse of [`parse`] for it), for clients that
/// build names: spaces become `+`, and everything but letters, digits and `-_.~` is
/// percent-encoded.
pub fn encode_command_line(argv: &[&str]) -> String {
    const KEEP: &percent_encoding::AsciiSet =
        &percent_encoding::NON_ALPHANUMERIC.remove(b'-').remove(b'_').remove(b'.').remove(b'~');
    argv.iter().map(|a| percent_encoding::utf8_percent_encode(a, KEEP).to_string()).collect::<Vec<_>>().join("+")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn inv(handler: &str, args: &[&str]) -> Option<Invocation> {
        Some(Invocation {
            handler: handler.into(),
            args: args.iter().map(|s| s.to_string()).collect(),
            error_record: false,
        })
    }

    #[test]
    fn lerna_names_decode_to_the_program_base_name() {
        assert_eq!(parse("%2Fusr%2Fbin%2Fshp2img+-m+foo.map"), inv("shp2img", &["-m", "foo.map"]));
        assert_eq!(parse("wc%20-l%20a%2Fb.txt"), inv("wc", &["-l", "a/b.txt"]));
        assert_eq!(parse("csv+a.csv+-where+x+%3E+3"), inv("csv", &["a.csv", "-where", "x", ">", "3"]));
        let name = encode_command_line(&["/opt/csv", "my data.csv", "-sum", "a+b"]);
        assert_eq!(parse(&name), inv("csv", &["my", "data.csv", "-sum", "a+b"]));
    }

    #[test]
    fn short_names_split_on_commas_and_decode_each_argument() {
        assert_eq!(parse("csv@sales.csv,-sum,price"), inv("csv", &["sales.csv", "-sum", "price"]));
        assert_eq!(parse("wc@"), inv("wc", &[]));
        assert_eq!(parse("grep@a%2Cb,dir%2Ff"), inv("grep", &["a,b", "dir/f"]));
        let mut err = parse("wc@x.txt.err").unwrap();
        assert!(err.error_record);
        err.error_record = false;
        assert_eq!(Some(err), inv("wc", &["x.txt"]));
    }

    #[test]
    fn ordinary_names_are_not_invocations() {
        for name in ["notes.txt", "a.err", "Makefile", "@x", ".hidden@a", "%ff%fe", "+", "%20", "a b@c"] {
            assert!(!may_invoke(name), "{name}");
        }
        assert_eq!(parse("x@"), inv("x", &[]));
        assert!(parse(&format!("h@{}", ",".repeat(MAX_ARGS + 1))).is_none());
        assert!(parse("h@a%00b").is_none());
    }

    /// What the `text_parsers` fuzz target checks, on pseudo-random names built from the
    /// characters that matter: a decoded name only ever names a valid handler.
    #[test]
    fn random_names_decode_only_to_valid_invocations() {
        let alphabet = ['%', '+', '@', ',', '.', '/', ' ', 'a', 'b', '2', 'F', 'e', 'r', '\0', 'é', '-'];
        let mut x = 0x2545_f491_4f6c_dd1du64;
        let mut next = || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        for _ in 0..50_000 {
            let len = (next() % 24) as usize;
            let name: String = (0..len).map(|_| alphabet[(next() % alphabet.len() as u64) as usize]).collect();
            if let Some(inv) = parse(&name) {
                assert!(valid_handler_name(&inv.handler), "{name:?} -> {inv:?}");
                assert!(inv.args.len() <= MAX_ARGS && inv.args.iter().all(|a| !a.contains('\0')), "{name:?}");
            }
        }
    }
}
