//! Where the load is, over the last hour: every few seconds the console samples the
//! store's I/O counters (the export, each device, each file) and keeps what changed in a
//! ring buffer, so the page can plot time series and a heat map with no database. On a
//! cluster head the devices are the data nodes, from the accounts their heartbeats carry.

use crate::auth::User;
use crate::{json, ConsoleConfig, Resp};
use hyper::StatusCode;
use locus_proto::types::{IoCounters, Rights};
use locus_server::Shared;
use parking_lot::Mutex;
use serde::Serialize;
use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

/// Files kept per sample: those that moved the most in its interval.
const FILES_PER_SAMPLE: usize = 64;
/// Files in the busiest list and rows in the heat map.
const BUSIEST: usize = 20;
const HEAT_ROWS: usize = 12;

/// I/O in one interval.
#[derive(Clone, Copy, Debug, Default, Serialize, PartialEq, Eq)]
pub struct Io {
    pub reads: u64,
    pub writes: u64,
    pub read_bytes: u64,
    pub write_bytes: u64,
    /// Time spent serving them, in µs.
    pub read_us: u64,
    pub write_us: u64,
}

impl Io {
    fn between(now: &IoCounters, before: &IoCounters) -> Io {
        Io {
            reads: now.reads.saturating_sub(before.reads),
            writes: now.writes.saturating_sub(before.writes),
            read_bytes: now.read_bytes.saturating_sub(before.read_bytes),
            write_bytes: now.write_bytes.saturating_sub(before.write_bytes),
            read_us: now.read_ns.saturating_sub(before.read_ns) / 1000,
            write_us: now.write_ns.saturating_sub(before.write_ns) / 1000,
        }
    }

    fn add(&mut self, o: &Io) {
        self.reads += o.reads;
        self.writes += o.writes;
        self.read_bytes += o.read_bytes;
        self.write_bytes += o.write_bytes;
        self.read_us += o.read_us;
        self.write_us += o.write_us;
    }

    /// What ranks files: bytes moved, and a page's worth for each operation.
    fn weight(&self) -> u64 {
        self.read_bytes + self.write_bytes + 4096 * (self.reads + self.writes)
    }

    fn is_empty(&self) -> bool {
        self.reads == 0 && self.writes == 0
    }
}

struct Sample {
    /// Milliseconds since the Unix epoch at the end of its interval.
    t_ms: u64,
    export: Io,
    devices: Vec<Io>,
    files: Vec<(Arc<str>, u32, Io)>,
}

#[derive(Default)]
struct State {
    samples: VecDeque<Sample>,
    export: IoCounters,
    devices: Vec<IoCounters>,
    files: HashMap<String, IoCounters>,
    primed: bool,
    /// A head's data nodes, in the order of `devices`.
    device_names: Vec<String>,
}

/// The ring buffer of samples.
pub struct LoadHistory {
    capacity: usize,
    interval_ms: u64,
    state: Mutex<State>,
}

impl LoadHistory {
    pub fn new(config: &ConsoleConfig) -> LoadHistory {
        let every = config.sample_every.as_millis().max(1);
        LoadHistory {
            capacity: (config.history.as_millis() / every).max(2) as usize,
            interval_ms: every as u64,
            state: Mutex::new(State::default()),
        }
    }

    /// Takes one sample: what the counters moved since the last. On a cluster head the
    /// devices are its data nodes, from their accounts (the totals their heartbeats
    /// carry), and the export their sum; files are not named there.
    pub fn sample(&self, shared: &Shared) {
        let (export, devices, files) = match shared.data_node_io() {
            Some(nodes) => {
                let mut sum = IoCounters::default();
                for (_, io) in &nodes {
                    sum.reads = sum.reads.saturating_add(io.reads);
                    sum.read_bytes = sum.read_bytes.saturating_add(io.read_bytes);
                    sum.read_ns = sum.read_ns.saturating_add(io.read_ns);
                    sum.writes = sum.writes.saturating_add(io.writes);
                    sum.write_bytes = sum.write_bytes.saturating_add(io.write_bytes);
                    sum.write_ns = sum.write_ns.saturating_add(io.write_ns);
                }
                let (names, io): (Vec<String>, Vec<IoCounters>) = nodes.into_iter().unzip();
                let mut state = self.state.lock();
                if state.device_names != names {
                    // Nodes joined or left: their series start again.
                    state.device_names = names;
                    state.devices = Vec::new();
                    state.samples.clear();
                    state.primed = false;
                }
                drop(state);
                (sum, io, Vec::new())
            }
            None => {
                let counters = shared.store.counters();
                (counters.export(), counters.devices(), counters.all())
            }
        };
        let t_ms =
            std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64);
        let mut state = self.state.lock();
        let zero = IoCounters::default();
        let mut moved: Vec<(Arc<str>, u32, Io)> = files
            .iter()
            .filter_map(|f| {
                let io = Io::between(&f.io, state.files.get(&f.path).unwrap_or(&zero));
                // The store names files relative to the root; the console absolutely.
                (!io.is_empty()).then(|| (Arc::from(format!("/{}", f.path.trim_start_matches('/'))), f.device, io))
            })
            .collect();
        moved.sort_by_key(|(_, _, io)| std::cmp::Reverse(io.weight()));
        moved.truncate(FILES_PER_SAMPLE);
        let sample = Sample {
            t_ms,
            export: Io::between(&export, &state.export),
            devices: devices
                .iter()
                .enumerate()
                .map(|(i, d)| Io::between(d, state.devices.get(i).unwrap_or(&zero)))
                .collect(),
            files: moved,
        };
        state.export = export;
        state.devices = devices;
        state.files = files.into_iter().map(|f| (f.path, f.io)).collect();
        // The first sample only sets the baseline: what came before the console started
        // is not one interval's load.
        if !std::mem::replace(&mut state.primed, true) {
            return;
        }
        if state.samples.len() == self.capacity {
            state.samples.pop_front();
        }
        state.samples.push_back(sample);
    }

    /// `GET /api/load[?file=PATH]`: the samples (export and devices), the busiest files
    /// over the window, a heat map of the busiest files' bytes per interval, and with
    /// `file` that file's own series (zero where it was not among a sample's busiest).
    /// Only files in directories the subject may list are named.
    pub fn report(&self, shared: &Shared, user: &User, file: Option<&str>) -> Resp {
        let state = self.state.lock();
        let mut listable: HashMap<String, bool> = HashMap::new();
        let mut visible = |path: &str| -> bool {
            let parent = match path.rfind('/') {
                Some(0) | None => "/",
                Some(i) => &path[..i],
            };
            *listable
                .entry(parent.to_string())
                .or_insert_with(|| shared.store.rights(&user.subject, parent).is_ok_and(|r| r.contains(Rights::LIST)))
        };
        let mut totals: HashMap<Arc<str>, (u32, Io)> = HashMap::new();
        for s in &state.samples {
            for (path, device, io) in &s.files {
                totals.entry(path.clone()).or_insert((*device, Io::default())).1.add(io);
            }
        }
        let mut busiest: Vec<(Arc<str>, u32, Io)> =
            totals.into_iter().filter(|(p, _)| visible(p)).map(|(p, (d, io))| (p, d, io)).collect();
        busiest.sort_by(|a, b| b.2.weight().cmp(&a.2.weight()).then_with(|| a.0.cmp(&b.0)));
        busiest.truncate(BUSIEST);
        let rows: Vec<&Arc<str>> = busiest.iter().take(HEAT_ROWS).map(|(p, _, _)| p).collect();
        let mut heat = Vec::new();
        for (col, s) in state.samples.iter().enumerate() {
            for (path, _, io) in &s.files {
                if let Some(row) = rows.iter().position(|r| *r == path) {
                    heat.push(serde_json::json!([col, row, io.read_bytes + io.write_bytes, io.reads + io.writes]));
                }
            }
        }
        let series = file.filter(|f| visible(f)).map(|f| {
            let points: Vec<_> = state
                .samples
                .iter()
                .map(|s| {
                    let io = s.files.iter().find(|(p, _, _)| p.as_ref() == f).map_or(Io::default(), |(_, _, io)| *io);
                    serde_json::json!({ "t": s.t_ms, "io": io })
                })
                .collect();
            serde_json::json!({ "path": f, "samples": points })
        });
        let device_names = if shared.is_head() {
            state.device_names.clone()
        } else {
            let mut names = vec![shared.config.root.display().to_string()];
            names.extend(shared.config.devices.iter().map(|d| d.display().to_string()));
            names
        };
        let devices: Vec<String> = device_names
            .into_iter()
            .enumerate()
            .map(|(i, path)| if user.admin { format!("{i}: {path}") } else { format!("device {i}") })
            .collect();
        json(
            StatusCode::OK,
            &serde_json::json!({
                "interval_ms": self.interval_ms,
                "devices": devices,
                "samples": state.samples.iter().map(|s| serde_json::json!({
                    "t": s.t_ms, "export": s.export, "devices": s.devices,
                })).collect::<Vec<_>>(),
                "busiest": busiest.iter().map(|(p, d, io)| serde_json::json!({
                    "path": p.as_ref(), "device": d, "io": io,
                })).collect::<Vec<_>>(),
                "heat": { "files": rows.iter().map(|r| r.as_ref()).collect::<Vec<_>>(), "cells": heat },
                "file": series,
            }),
        )
    }
}
