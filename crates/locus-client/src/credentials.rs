//! Where a client finds its subject and token.
//!
//! In order: explicit options; `LOCUS_TOKEN` as `SUBJECT:TOKEN`, for every server; the
//! file `~/.locus/credentials` with `HOST:PORT SUBJECT TOKEN` lines, `HOST:PORT` as the
//! URL writes it (`[V6]:PORT` for IPv6). `locus serve` writes lines for its admin token
//! under the addresses a client on its host dials (`127.0.0.1:PORT`, `localhost:PORT`,
//! its listen address), so the CLI works on the same machine with no setup.
//!
//! A `*` line, which only a user writes by hand now (older `locus serve` did, and
//! replaces it when it starts), matches any server with no line of its own: that server
//! learns the subject's name and a proof, though not one it could use elsewhere (the
//! proof is bound to the server dialled, see `locus_proto::auth`).

use crate::error::{ClientError, Result};
use std::path::PathBuf;

/// A subject and its secret token.
#[derive(Clone, PartialEq, Eq)]
pub struct Credentials {
    pub subject: String,
    pub token: String,
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Credentials({}, <token>)", self.subject)
    }
}

/// `~/.locus`, the home of the embedded server and of the client's credentials.
pub fn locus_home() -> PathBuf {
    if let Some(dir) = std::env::var_os("LOCUS_HOME") {
        return PathBuf::from(dir);
    }
    let home = std::env::var_os("HOME").map(PathBuf::from).unwrap_or_else(|| PathBuf::from("/tmp"));
    home.join(".locus")
}

/// The credentials file.
pub fn credentials_file() -> PathBuf {
    locus_home().join("credentials")
}

impl Credentials {
    /// Parses `SUBJECT:TOKEN`.
    pub fn parse(s: &str) -> Result<Credentials> {
        match s.split_once(':') {
            Some((subject, token)) if !subject.is_empty() && !token.is_empty() => {
                Ok(Credentials { subject: subject.into(), token: token.into() })
            }
            _ => Err(ClientError::Config("credentials must be SUBJECT:TOKEN".into())),
        }
    }

    /// Finds credentials for the server at `authority` (`HOST:PORT`).
    pub fn find(authority: &str) -> Result<Credentials> {
        if let Ok(v) = std::env::var("LOCUS_TOKEN") {
            return Credentials::parse(&v);
        }
        let path = credentials_file();
        let text = std::fs::read_to_string(&path).map_err(|_| {
            ClientError::Config(format!(
                "no credentials for {authority}: set LOCUS_TOKEN=SUBJECT:TOKEN or add \"{authority} SUBJECT TOKEN\" to {}",
                path.display()
            ))
        })?;
        let mut wildcard = None;
        for line in text.lines().map(str::trim).filter(|l| !l.is_empty() && !l.starts_with('#')) {
            let parts: Vec<&str> = line.split_whitespace().collect();
            if let [server, subject, token] = parts[..] {
                let c = Credentials { subject: subject.into(), token: token.into() };
                if server == authority {
                    return Ok(c);
                }
                if server == "*" && wildcard.is_none() {
                    wildcard = Some(c);
                }
            }
        }
        wildcard.ok_or_else(|| ClientError::Config(format!("no credentials for {authority} in {}", path.display())))
    }
}
