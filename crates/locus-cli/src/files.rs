//! The file commands: each parses its URLs, connects once per server and reports one
//! clear line on failure.

use crate::output;
use crate::Command;
use crate::{AclCommand, ClusterCommand, NodeCommand, RebalanceCommand, ScriptCommand, StoreletCommand};
use indicatif::{ProgressBar, ProgressStyle};
use locus_client::types::Value;
use locus_client::types::{Rights, S_IFDIR, S_IFMT};
use locus_client::{Client, ClientError, LocusUrl, StoreletUpdate};
use locus_drivers::join;
use std::collections::HashMap;
use std::path::{Path, PathBuf};

/// Files at least this large get a progress bar (on a terminal).
const PROGRESS_MIN: u64 = 4 << 20;

/// Connections by server, so a command naming several URLs of one server connects once.
#[derive(Default)]
struct Connections(HashMap<String, Client>);

impl Connections {
    async fn get(&mut self, url: &LocusUrl) -> Result<Client, String> {
        let key = url.with_path("/").to_string();
        if let Some(c) = self.0.get(&key) {
            return Ok(c.clone());
        }
        let c = Client::connect_url(url).await.map_err(|e| format!("{}: {e}", url.authority()))?;
        self.0.insert(key, c.clone());
        Ok(c)
    }
}

fn parse(url: &str) -> Result<LocusUrl, String> {
    LocusUrl::parse(url).map_err(|e| e.to_string())
}

fn err(url: &LocusUrl, e: ClientError) -> String {
    format!("{url}: {e}")
}

fn progress(len: u64, what: &str) -> ProgressBar {
    if len < PROGRESS_MIN {
        return ProgressBar::hidden();
    }
    let pb = ProgressBar::new(len);
    pb.set_style(
        ProgressStyle::with_template("{msg} [{bar:30}] {bytes}/{total_bytes} {bytes_per_sec} eta {eta}")
            .expect("template")
            .progress_chars("=> "),
    );
    pb.set_message(what.to_string());
    pb
}

/// Runs one of the client-side commands.
pub async fn run(cmd: Command, json: bool) -> Result<(), String> {
    let mut conns = Connections::default();
    match cmd {
        Command::Ls { url, long } => {
            let u = parse(&url)?;
            let c = conns.get(&u).await?;
            let attr = c.stat(&u.path).await.map_err(|e| err(&u, e))?;
            let mut entries = if attr.is_dir() {
                c.readdir(&u.path).await.map_err(|e| err(&u, e))?
            } else {
                vec![locus_client::types::DirEntry { name: u.path.rsplit('/').next().unwrap_or("").to_string(), attr }]
            };
            entries.sort_by(|a, b| a.name.cmp(&b.name));
            if json {
                println!("{}", output::entries_json(&entries));
            } else {
                for e in &entries {
                    println!("{}", if long { output::long_line(&e.name, &e.attr) } else { e.name.clone() });
                }
            }
        }
        Command::Stat { url, no_follow } => {
            let u = parse(&url)?;
            let c = conns.get(&u).await?;
            let a = if no_follow { c.lstat(&u.path).await } else { c.stat(&u.path).await }.map_err(|e| err(&u, e))?;
            if json {
                println!("{}", output::attr_json(&a));
            } else {
                println!("{}", output::attr_text(&u.path, &a));
            }
        }
        Command::Cat { url } => {
            let u = parse(&url)?;
            let c = conns.get(&u).await?;
            let mut out = tokio::io::stdout();
            c.get(&u.path, &mut out, |_, _| {}).await.map_err(|e| err(&u, e))?;
        }
        Command::Get { url, local } => {
            let u = parse(&url)?;
            let c = conns.get(&u).await?;
            download(&c, &u, &local).await?;
        }
        Command::Put { local, url } => {
            let u = parse(&url)?;
            let c = conns.get(&u).await?;
            upload(&c, &local, &u).await?;
        }
        Command::Cp { source, dest, recursive } => copy(&mut conns, &source, &dest, recursive).await?,
        Command::Rm { urls, recursive } => {
            for url in urls {
                let u = parse(&url)?;
                let c = conns.get(&u).await?;
                remove(&c, &u, recursive).await?;
            }
        }
        Command::Mkdir { urls, parents } => {
            for url in urls {
                let u = parse(&url)?;
                let c = conns.get(&u).await?;
                if parents {
                    mkdir_p(&c, &u).await?;
                } else {
                    c.mkdir(&u.path, 0o755).await.map_err(|e| err(&u, e))?;
                }
            }
        }
        Command::Mv { from, to } => {
            let (a, b) = (parse(&from)?, parse(&to)?);
            if a.authority() != b.authority() {
                return Err("mv works within one server; use cp and rm across servers".into());
            }
            let c = conns.get(&a).await?;
            c.rename(&a.path, &b.path).await.map_err(|e| err(&a, e))?;
        }
        Command::Df { url } => {
            let u = parse(&url)?;
            let c = conns.get(&u).await?;
            let s = c.statfs(&u.path).await.map_err(|e| err(&u, e))?;
            if json {
                println!("{}", output::statfs_json(&s));
            } else {
                let size = |blocks: u64| output::human(blocks * s.frsize);
                println!("{:>12} {:>12} {:>12} {:>5}", "size", "used", "available", "use%");
                let used = s.blocks - s.bfree;
                let pct = (used * 100).checked_div(s.blocks).unwrap_or(0);
                println!("{:>12} {:>12} {:>12} {:>4}%", size(s.blocks), size(used), size(s.bavail), pct);
            }
        }
        Command::Acl(AclCommand::Get { url }) => {
            let u = parse(&url)?;
            let c = conns.get(&u).await?;
            let acl = c.acl_get(&u.path).await.map_err(|e| err(&u, e))?;
            if json {
                let v: Vec<_> = acl
                    .iter()
                    .map(|e| serde_json::json!({"subject": e.subject, "rights": e.rights.to_string()}))
                    .collect();
                println!("{}", serde_json::Value::Array(v));
            } else {
                for e in acl {
                    println!("{} {}", e.subject, e.rights);
                }
            }
        }
        Command::Acl(AclCommand::Set { url, subject, rights }) => {
            let u = parse(&url)?;
            let rights = Rights::parse(&rights)?;
            let c = conns.get(&u).await?;
            c.acl_set(&u.path, &subject, rights).await.map_err(|e| err(&u, e))?;
        }
        Command::Stats { url, top, devices } => {
            let u = parse(&url)?;
            let c = conns.get(&u).await?;
            let r = c.stats(top).await.map_err(|e| err(&u, e))?;
            if devices {
                print_either(json, &r.devices, || output::devices_text(&r.devices))?;
            } else {
                print_either(json, &r, || output::stats_text(&r))?;
            }
        }
        Command::Rebalance(cmd) => {
            let (url, max_moves, apply) = match cmd {
                RebalanceCommand::Plan { url, max_moves } => (url, max_moves, false),
                RebalanceCommand::Apply { url, max_moves } => (url, max_moves, true),
            };
            let u = parse(&url)?;
            let c = conns.get(&u).await?;
            let r = if apply {
                c.call(locus_client::ops::RebalanceApply { max_moves }).await
            } else {
                c.call(locus_client::ops::RebalancePlan { max_moves }).await
            }
            .map_err(|e| err(&u, e))?;
            print_either(json, &r, || output::rebalance_text(&r, apply))?;
        }
        Command::Script(ScriptCommand::Register { url, file }) => {
            let u = parse(&url)?;
            let source = std::fs::read_to_string(&file).map_err(|e| format!("{}: {e}", file.display()))?;
            let c = conns.get(&u).await?;
            let id = c.script_register(&source).await.map_err(|e| err(&u, e))?;
            println!("{id}");
        }
        Command::Script(ScriptCommand::Call { url, script, args, input, output }) => {
            let u = parse(&url)?;
            let c = conns.get(&u).await?;
            let args: Vec<Value> = args.iter().map(|a| output::parse_arg(a)).collect();
            let input = match input {
                Some(p) => std::fs::read(&p).map_err(|e| format!("{}: {e}", p.display()))?,
                None => Vec::new(),
            };
            let is_id = script.len() == 64 && script.chars().all(|c| c.is_ascii_hexdigit());
            let (values, out) = if is_id {
                c.script_call_id(&script, args, &input).await
            } else {
                let source = std::fs::read_to_string(&script).map_err(|e| format!("{script}: {e}"))?;
                c.script_call(&source, args, &input).await
            }
            .map_err(|e| err(&u, e))?;
            match output {
                Some(p) => std::fs::write(&p, &out).map_err(|e| format!("{}: {e}", p.display()))?,
                None => std::io::Write::write_all(&mut std::io::stdout(), &out).map_err(|e| e.to_string())?,
            }
            if !values.is_empty() || json {
                println!("{}", serde_json::Value::Array(values.iter().map(output::value_json).collect()));
            }
        }
        Command::Storelet(StoreletCommand::Run { module, dir, write, env, account, args }) => {
            let u = parse(&dir)?;
            let wasm = std::fs::read(&module).map_err(|e| format!("{}: {e}", module.display()))?;
            let env = env
                .iter()
                .map(|kv| kv.split_once('=').map(|(k, v)| (k.to_string(), v.to_string())))
                .collect::<Option<Vec<_>>>()
                .ok_or("--env takes NAME=VALUE")?;
            let c = conns.get(&u).await?;
            let mut run = c.storelet_start_env(&wasm, &u.path, args, env, write).await.map_err(|e| err(&u, e))?;
            let (mut stdout, mut stderr) = (std::io::stdout().lock(), std::io::stderr());
            let result = loop {
                use std::io::Write;
                match run.next().await.map_err(|e| err(&u, e))? {
                    Some(StoreletUpdate::Stdout(b)) => stdout.write_all(&b).and_then(|()| stdout.flush()),
                    Some(StoreletUpdate::Stderr(b)) => stderr.write_all(&b),
                    Some(StoreletUpdate::Started { .. }) => Ok(()),
                    Some(StoreletUpdate::Finished(r)) => break r,
                    None => return Err("the server ended the run without an account".into()),
                }
                .map_err(|e| e.to_string())?;
            };
            if json {
                eprintln!("{}", serde_json::to_string(&result).map_err(|e| e.to_string())?);
            } else if account {
                eprintln!("{}", output::storelet_account(&result));
            }
            if result.exit_code != 0 {
                return Err(format!("storelet exited with status {}", result.exit_code));
            }
        }
        Command::Handlers { url } => {
            let u = parse(&url)?;
            let list = conns.get(&u).await?.handlers().await.map_err(|e| err(&u, e))?;
            print_either(json, &list, || output::handlers(&list) + "\n")?;
        }
        Command::Share { url, ttl } => {
            let u = parse(&url)?;
            let req = locus_proto::ops::Share { path: u.path.clone(), ttl_s: ttl };
            println!("{}", conns.get(&u).await?.call(req).await.map_err(|e| err(&u, e))?);
        }
        Command::Cluster(ClusterCommand::RotateKey { url }) => {
            let u = parse(&url)?;
            conns.get(&u).await?.call(locus_proto::ops::KeyRotate {}).await.map_err(|e| err(&u, e))?;
            eprintln!("cluster key rotated: data nodes learn it when they next join (within seconds)");
        }
        Command::Node(NodeCommand::List { url }) => {
            let u = parse(&url)?;
            let nodes = conns.get(&u).await?.call(locus_proto::ops::NodeList {}).await.map_err(|e| err(&u, e))?;
            print_either(json, &nodes, || output::nodes(&nodes) + "\n")?;
        }
        Command::Node(NodeCommand::Drain { url, node }) => {
            let u = parse(&url)?;
            conns.get(&u).await?.call(locus_proto::ops::NodeDrain { node }).await.map_err(|e| err(&u, e))?;
            eprintln!("node {node} draining: its versions are being copied to other nodes (see `locus node list`)");
        }
        Command::Node(NodeCommand::Remove { url, node }) => {
            let u = parse(&url)?;
            conns.get(&u).await?.call(locus_proto::ops::NodeRemove { node }).await.map_err(|e| err(&u, e))?;
            eprintln!("node {node} removed");
        }
        Command::Storelet(StoreletCommand::Ps { url }) => {
            let u = parse(&url)?;
            let runs = conns.get(&u).await?.storelet_ps().await.map_err(|e| err(&u, e))?;
            print_either(json, &runs, || output::storelet_ps(&runs) + "\n")?;
        }
        Command::Storelet(StoreletCommand::Cancel { url, run }) => {
            let u = parse(&url)?;
            conns.get(&u).await?.storelet_cancel(run).await.map_err(|e| err(&u, e))?;
        }
        Command::Storelet(StoreletCommand::Stats { url }) => {
            let u = parse(&url)?;
            let report = conns.get(&u).await?.storelet_stats().await.map_err(|e| err(&u, e))?;
            print_either(json, &report, || output::storelet_report(&report) + "\n")?;
        }
        Command::Serve(_)
        | Command::Token { .. }
        | Command::Bench(_)
        | Command::Mount { .. }
        | Command::Umount { .. }
        | Command::RunAgent { .. } => {
            unreachable!("handled in main")
        }
    }
    Ok(())
}

async fn download(c: &Client, u: &LocusUrl, local: &Path) -> Result<(), String> {
    let attr = c.stat(&u.path).await.map_err(|e| err(u, e))?;
    let pb = progress(attr.size, &u.path);
    // A device or a pipe (/dev/null, a FIFO) is written as it is: it cannot be replaced.
    if std::fs::metadata(local).is_ok_and(|m| !m.is_file() && !m.is_dir()) {
        let file = tokio::fs::OpenOptions::new()
            .write(true)
            .open(local)
            .await
            .map_err(|e| format!("{}: {e}", local.display()))?;
        let mut out = tokio::io::BufWriter::with_capacity(1 << 20, file);
        let got = c.get(&u.path, &mut out, |n, _| pb.set_position(n)).await;
        pb.finish_and_clear();
        return got.map(drop).map_err(|e| err(u, e));
    }
    // Write beside the target and rename, so a failed download leaves no half file.
    let tmp = local.with_file_name(format!(
        ".{}.locus-partial",
        local.file_name().map(|n| n.to_string_lossy().to_string()).unwrap_or_default()
    ));
    let file = tokio::fs::File::create(&tmp).await.map_err(|e| format!("{}: {e}", tmp.display()))?;
    let mut out = tokio::io::BufWriter::with_capacity(1 << 20, file);
    let got = c.get(&u.path, &mut out, |n, _| pb.set_position(n)).await;
    pb.finish_and_clear();
    match got {
        Ok(a) => {
            let _ = std::fs::set_permissions(&tmp, std::os::unix::fs::PermissionsExt::from_mode(a.mode & 0o777));
            std::fs::rename(&tmp, local).map_err(|e| format!("{}: {e}", local.display()))
        }
        Err(e) => {
            let _ = std::fs::remove_file(&tmp);
            Err(err(u, e))
        }
    }
}

async fn upload(c: &Client, local: &Path, u: &LocusUrl) -> Result<(), String> {
    let file = tokio::fs::File::open(local).await.map_err(|e| format!("{}: {e}", local.display()))?;
    let meta = file.metadata().await.map_err(|e| format!("{}: {e}", local.display()))?;
    if meta.is_dir() {
        return Err(format!("{}: is a directory (use cp -r)", local.display()));
    }
    let mode = std::os::unix::fs::PermissionsExt::mode(&meta.permissions()) & 0o777;
    let pb = progress(meta.len(), &local.display().to_string());
    let mut src = tokio::io::BufReader::with_capacity(1 << 20, file);
    // A regular file's size is known: on a cluster head a large one goes straight to
    // the data nodes.
    let r = match meta.is_file() {
        true => c.put_sized(&u.path, mode, &mut src, meta.len(), |n| pb.set_position(n)).await,
        false => c.put(&u.path, mode, &mut src, |n| pb.set_position(n)).await,
    };
    pb.finish_and_clear();
    r.map(|_| ()).map_err(|e| err(u, e))
}

async fn mkdir_p(c: &Client, u: &LocusUrl) -> Result<(), String> {
    let mut path = String::new();
    for comp in u.path.split('/').filter(|s| !s.is_empty()) {
        path.push('/');
        path.push_str(comp);
        match c.mkdir(&path, 0o755).await {
            Ok(()) => {}
            Err(ClientError::Remote(e)) if e.code == locus_proto::Code::EXIST => {
                let a = c.stat(&path).await.map_err(|e| err(&u.with_path(&path), e))?;
                if !a.is_dir() {
                    return Err(format!("{}: exists and is not a directory", u.with_path(&path)));
                }
            }
            Err(e) => return Err(err(&u.with_path(&path), e)),
        }
    }
    Ok(())
}

async fn remove(c: &Client, u: &LocusUrl, recursive: bool) -> Result<(), String> {
    let a = c.lstat(&u.path).await.map_err(|e| err(u, e))?;
    if a.mode & S_IFMT != S_IFDIR {
        return c.unlink(&u.path).await.map_err(|e| err(u, e));
    }
    if !recursive {
        return Err(format!("{u}: is a directory (use rm -r)"));
    }
    // Depth first, without recursion in async code: a stack of directories to empty.
    let mut stack = vec![(u.path.clone(), false)];
    while let Some((dir, emptied)) = stack.pop() {
        if emptied {
            c.rmdir(&dir).await.map_err(|e| err(&u.with_path(&dir), e))?;
            continue;
        }
        stack.push((dir.clone(), true));
        for e in c.readdir(&dir).await.map_err(|e| err(&u.with_path(&dir), e))? {
            let p = join(&dir, &e.name);
            if e.attr.is_dir() {
                stack.push((p, false));
            } else {
                c.unlink(&p).await.map_err(|e| err(&u.with_path(&p), e))?;
            }
        }
    }
    Ok(())
}

async fn copy(conns: &mut Connections, source: &str, dest: &str, recursive: bool) -> Result<(), String> {
    let remote = |s: &str| s.starts_with("locus://") || s.starts_with("locus+tls://");
    match (remote(source), remote(dest)) {
        (false, true) => {
            let u = parse(dest)?;
            let c = conns.get(&u).await?;
            let src = PathBuf::from(source);
            let meta = std::fs::metadata(&src).map_err(|e| format!("{source}: {e}"))?;
            // Copying into an existing remote directory puts the source inside it, as cp does.
            let mut target = u.clone();
            if let Ok(a) = c.stat(&u.path).await {
                if a.is_dir() {
                    let name = src.file_name().ok_or_else(|| format!("{source}: no file name"))?;
                    target = u.with_path(&join(&u.path, &name.to_string_lossy()));
                }
            }
            if !meta.is_dir() {
                return upload(&c, &src, &target).await;
            }
            if !recursive {
                return Err(format!("{source}: is a directory (use cp -r)"));
            }
            let mut stack = vec![(src, target)];
            while let Some((dir, to)) = stack.pop() {
                if let Err(e) = c.mkdir(&to.path, 0o755).await {
                    if e.code() != locus_proto::Code::EXIST {
                        return Err(err(&to, e));
                    }
                }
                for entry in std::fs::read_dir(&dir).map_err(|e| format!("{}: {e}", dir.display()))? {
                    let entry = entry.map_err(|e| format!("{}: {e}", dir.display()))?;
                    let name = entry.file_name().to_string_lossy().to_string();
                    let child = to.with_path(&join(&to.path, &name));
                    let ft = entry.file_type().map_err(|e| e.to_string())?;
                    if ft.is_dir() {
                        stack.push((entry.path(), child));
                    } else if ft.is_symlink() {
                        let target = std::fs::read_link(entry.path()).map_err(|e| e.to_string())?;
                        c.symlink(&target.to_string_lossy(), &child.path).await.map_err(|e| err(&child, e))?;
                    } else {
                        upload(&c, &entry.path(), &child).await?;
                    }
                }
            }
            Ok(())
        }
        (true, false) => {
            let u = parse(source)?;
            let c = conns.get(&u).await?;
            let a = c.stat(&u.path).await.map_err(|e| err(&u, e))?;
            let mut local = PathBuf::from(dest);
            if local.is_dir() {
                let name = u.path.trim_end_matches('/').rsplit('/').next().unwrap_or("").to_string();
                if !name.is_empty() {
                    local = local.join(name);
                }
            }
            if !a.is_dir() {
                return download(&c, &u, &local).await;
            }
            if !recursive {
                return Err(format!("{u}: is a directory (use cp -r)"));
            }
            let mut stack = vec![(u.path.clone(), local)];
            while let Some((dir, to)) = stack.pop() {
                match std::fs::create_dir(&to) {
                    Ok(()) => {}
                    Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists && to.is_dir() => {}
                    Err(e) => return Err(format!("{}: {e}", to.display())),
                }
                for e in c.readdir(&dir).await.map_err(|e| err(&u.with_path(&dir), e))? {
                    let from = join(&dir, &e.name);
                    let child = to.join(&e.name);
                    if e.attr.is_dir() {
                        stack.push((from, child));
                    } else if e.attr.is_symlink() {
                        let target = c.readlink(&from).await.map_err(|e| err(&u.with_path(&from), e))?;
                        std::os::unix::fs::symlink(target, &child).map_err(|e| format!("{}: {e}", child.display()))?;
                    } else {
                        download(&c, &u.with_path(&from), &child).await?;
                    }
                }
            }
            Ok(())
        }
        (true, true) => Err("cp between two remote paths is not supported yet; copy through a local file".into()),
        (false, false) => Err("cp needs a locus:// URL on at least one side".into()),
    }
}

/// Prints `value` as JSON with `--json`, else the text `text` makes (as it is: it ends
/// its own lines).
fn print_either<T: serde::Serialize>(json: bool, value: &T, text: impl FnOnce() -> String) -> Result<(), String> {
    if json {
        println!("{}", serde_json::to_string(value).map_err(|e| e.to_string())?);
    } else {
        print!("{}", text());
    }
    Ok(())
}
