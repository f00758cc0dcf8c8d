// The Locus web console: a page per view (files, load, code), filled from the JSON API
// under /api/. Text goes into the page with textContent only, never as HTML.
"use strict";

const state = { user: null, timer: null, charts: {} };

const $ = (id) => document.getElementById(id);

// Calls the API; throws an Error carrying the HTTP status and the server's message.
async function api(path, options = {}) {
  const init = { credentials: "same-origin", ...options };
  if (init.method && init.method !== "GET") {
    init.headers = { ...(init.headers || {}), "X-Locus-Console": "1" };
  }
  const response = await fetch("/api/" + path, init);
  const body = await response.json().catch(() => ({}));
  if (!response.ok) {
    const e = new Error(body.error || response.statusText);
    e.status = response.status;
    throw e;
  }
  return body;
}

function bytes(n) {
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  while (n >= 1024 && i < units.length - 1) { n /= 1024; i++; }
  return (i === 0 ? n : n.toFixed(1)) + " " + units[i];
}

function micros(us) {
  if (us < 1000) return us + " µs";
  if (us < 1e6) return (us / 1000).toFixed(1) + " ms";
  return (us / 1e6).toFixed(2) + " s";
}

function clock(ms) {
  return new Date(ms).toLocaleTimeString([], { hour12: false });
}

function cell(row, text, cls) {
  const td = row.insertCell();
  td.textContent = text;
  if (cls) td.className = cls;
  return td;
}

function joinPath(dir, name) {
  return (dir.endsWith("/") ? dir : dir + "/") + name;
}

// Shows one view and starts its refresh; stops the others'.
function show(view) {
  for (const v of document.querySelectorAll(".view")) v.hidden = v.id !== "view-" + view;
  for (const a of document.querySelectorAll("#nav a")) a.classList.toggle("active", a.dataset.view === view);
  clearInterval(state.timer);
  state.timer = null;
}

async function route() {
  if (!state.user) return;
  const hash = decodeURIComponent(location.hash.slice(1));
  if (hash.startsWith("files=")) {
    show("files");
    await files(hash.slice(6) || "/");
  } else if (hash === "load") {
    show("load");
    await load();
    state.timer = setInterval(load, 5000);
  } else if (hash === "code") {
    show("code");
    await code();
    state.timer = setInterval(code, 2000);
  } else {
    location.hash = "#files=/";
  }
}

// --- Logging in ---

async function start() {
  try {
    state.user = await api("whoami");
  } catch (e) {
    state.user = null;
  }
  $("nav").hidden = $("logout").hidden = !state.user;
  if (!state.user) {
    $("who").textContent = "";
    show("login");
    return;
  }
  $("who").textContent = state.user.subject + (state.user.admin ? " (admin)" : "");
  await route();
}

$("login-form").addEventListener("submit", async (event) => {
  event.preventDefault();
  $("login-error").textContent = "";
  try {
    await api("login", { method: "POST", body: JSON.stringify({ token: $("token").value }) });
    $("token").value = "";
    await start();
  } catch (e) {
    $("login-error").textContent = "Refused: " + e.message;
  }
});

$("logout").addEventListener("click", async () => {
  await api("logout", { method: "POST" }).catch(() => {});
  state.user = null;
  await start();
});

window.addEventListener("hashchange", route);

// --- Files ---

async function files(path) {
  $("files-path").textContent = path;
  $("preview").hidden = true;
  const tbody = $("files-table").tBodies[0];
  let listing;
  try {
    listing = await api("list?path=" + encodeURIComponent(path));
  } catch (e) {
    tbody.replaceChildren();
    $("files-status").textContent = path + ": " + e.message;
    return;
  }
  const n = listing.entries.length;
  $("files-status").textContent = n + (n === 1 ? " entry" : " entries") + "; your rights here: " + listing.rights;
  $("upload-form").hidden = !listing.rights.includes("w");
  $("upload-form").dataset.dir = path;
  const rows = [];
  if (path !== "/") {
    const up = document.createElement("tr");
    const a = document.createElement("a");
    a.textContent = "..";
    a.href = "#files=" + encodeURIComponent(path.replace(/\/[^/]*\/?$/, "") || "/");
    up.insertCell().append(a);
    for (let i = 0; i < 4; i++) up.insertCell();
    rows.push(up);
  }
  for (const e of listing.entries) {
    const row = document.createElement("tr");
    row.dataset.name = e.name;
    const full = joinPath(path, e.name);
    const name = row.insertCell();
    const a = document.createElement("a");
    a.textContent = e.name + (e.kind === "dir" ? "/" : "");
    if (e.kind === "dir") {
      a.href = "#files=" + encodeURIComponent(full);
    } else {
      a.href = "#files=" + encodeURIComponent(path);
      a.addEventListener("click", (ev) => { ev.preventDefault(); preview(full); });
    }
    name.append(a);
    cell(row, e.kind === "dir" ? "" : bytes(e.size), "num");
    cell(row, e.mode);
    cell(row, new Date(e.mtime * 1000).toLocaleString());
    const actions = row.insertCell();
    if (e.kind === "file") {
      const d = document.createElement("a");
      d.textContent = "download";
      d.className = "download";
      d.href = "/api/download?path=" + encodeURIComponent(full);
      actions.append(d);
    }
    rows.push(row);
  }
  tbody.replaceChildren(...rows);
}

async function preview(path) {
  $("preview-name").textContent = path;
  $("preview").hidden = false;
  try {
    const p = await api("preview?path=" + encodeURIComponent(path));
    $("preview-text").textContent = p.text === null
      ? "(binary file, " + bytes(p.size) + ": download it to see it)"
      : p.text + (p.truncated ? "\n… (" + bytes(p.size) + " in all; download for the rest)" : "");
  } catch (e) {
    $("preview-text").textContent = path + ": " + e.message;
  }
}

$("upload-form").addEventListener("submit", async (event) => {
  event.preventDefault();
  const dir = $("upload-form").dataset.dir;
  for (const f of $("upload-input").files) {
    $("files-status").textContent = "uploading " + f.name + " (" + bytes(f.size) + ")…";
    try {
      await api("upload?path=" + encodeURIComponent(joinPath(dir, f.name)), { method: "PUT", body: f });
    } catch (e) {
      $("files-status").textContent = f.name + ": " + e.message;
      return;
    }
  }
  $("upload-input").value = "";
  await files(dir);
});

// --- Load ---

const palette = ["#2563eb", "#dc2626", "#16a34a", "#d97706", "#7c3aed", "#0891b2"];

// Draws (or redraws) a chart; without Chart.js (a build without npm) it says so.
function chart(id, config) {
  const canvas = $(id);
  if (typeof Chart === "undefined") {
    canvas.replaceWith(Object.assign(document.createElement("p"), { textContent: "(plots unavailable in this build)" }));
    return;
  }
  if (state.charts[id]) state.charts[id].destroy();
  config.options = { animation: false, responsive: true, maintainAspectRatio: false, ...config.options };
  state.charts[id] = new Chart(canvas, config);
  const points = config.data.datasets.reduce((n, d) => n + d.data.length, 0);
  canvas.dataset.points = String(points);
}

function timeAxis() {
  return { type: "linear", ticks: { callback: (v) => clock(v), maxTicksLimit: 8 } };
}

async function load() {
  let l;
  try {
    l = await api("load" + (state.loadFile ? "?file=" + encodeURIComponent(state.loadFile) : ""));
  } catch (e) {
    $("load-status").textContent = e.message;
    return;
  }
  const secs = l.interval_ms / 1000;
  $("load-status").textContent = l.samples.length + " samples, one every " + secs + " s (the last hour is kept)";
  const line = (label, data, i) => ({ label, data, borderColor: palette[i % palette.length], pointRadius: 0, borderWidth: 2 });
  chart("chart-bytes", {
    type: "line",
    data: {
      datasets: [
        line("read", l.samples.map((s) => ({ x: s.t, y: s.export.read_bytes / secs })), 0),
        line("written", l.samples.map((s) => ({ x: s.t, y: s.export.write_bytes / secs })), 1),
      ],
    },
    options: { scales: { x: timeAxis(), y: { beginAtZero: true, ticks: { callback: (v) => bytes(v) + "/s" } } } },
  });
  chart("chart-ops", {
    type: "line",
    data: {
      datasets: l.devices.map((name, d) =>
        line(name, l.samples.map((s) => ({ x: s.t, y: ((s.devices[d] || {}).reads + (s.devices[d] || {}).writes || 0) / secs })), d)),
    },
    options: { scales: { x: timeAxis(), y: { beginAtZero: true } } },
  });
  chart("chart-times", {
    type: "line",
    data: {
      datasets: l.devices.map((name, d) =>
        line(name, l.samples.map((s) => {
          const io = s.devices[d] || { reads: 0, writes: 0, read_us: 0, write_us: 0 };
          const n = io.reads + io.writes;
          return { x: s.t, y: n ? (io.read_us + io.write_us) / n : 0 };
        }), d)),
    },
    options: { scales: { x: timeAxis(), y: { beginAtZero: true } } },
  });
  const files = l.heat.files;
  const max = Math.max(1, ...l.heat.cells.map((c) => c[2]));
  chart("chart-heat", {
    type: "matrix",
    data: {
      datasets: [{
        label: "bytes",
        data: l.heat.cells.map(([col, row, b, ops]) => ({ x: l.samples[col].t, y: files[row], v: b, ops })),
        backgroundColor: (c) => {
          const v = c.raw ? c.raw.v : 0;
          return "rgba(220, 38, 38, " + (0.1 + 0.9 * Math.sqrt(v / max)).toFixed(3) + ")";
        },
        width: (c) => Math.max(2, (c.chart.chartArea || { width: 0 }).width / Math.max(1, l.samples.length) - 1),
        height: (c) => Math.max(4, (c.chart.chartArea || { height: 0 }).height / Math.max(1, files.length) - 2),
      }],
    },
    options: {
      plugins: {
        legend: { display: false },
        tooltip: { callbacks: { label: (c) => c.raw.y + ": " + bytes(c.raw.v) + ", " + c.raw.ops + " ops at " + clock(c.raw.x) } },
      },
      scales: {
        x: { ...timeAxis(), offset: true },
        y: { type: "category", labels: files, offset: true, ticks: { autoSkip: false } },
      },
    },
  });
  if (!state.loadFile && l.busiest.length) {
    // The busiest file gets the one-file plot until another is picked.
    state.loadFile = l.busiest[0].path;
    return load();
  }
  if (l.file) {
    $("file-caption").textContent = l.file.path + ": bytes per second and mean service time (µs)";
    const perSec = (key) => l.file.samples.map((s) => ({ x: s.t, y: s.io[key] / secs }));
    chart("chart-file", {
      type: "line",
      data: {
        datasets: [
          line("read B/s", perSec("read_bytes"), 0),
          line("written B/s", perSec("write_bytes"), 1),
          {
            ...line("mean µs", l.file.samples.map((s) => {
              const n = s.io.reads + s.io.writes;
              return { x: s.t, y: n ? (s.io.read_us + s.io.write_us) / n : 0 };
            }), 3),
            yAxisID: "us",
            borderDash: [4, 3],
          },
        ],
      },
      options: {
        scales: {
          x: timeAxis(),
          y: { beginAtZero: true, ticks: { callback: (v) => bytes(v) + "/s" } },
          us: { position: "right", beginAtZero: true, grid: { drawOnChartArea: false } },
        },
      },
    });
  }
  const tbody = $("busiest").tBodies[0];
  tbody.replaceChildren(...l.busiest.map((f) => {
    const row = document.createElement("tr");
    row.className = "pick" + (f.path === state.loadFile ? " picked" : "");
    row.addEventListener("click", () => { state.loadFile = f.path; load(); });
    const n = f.io.reads + f.io.writes;
    cell(row, f.path);
    cell(row, String(f.device));
    cell(row, String(f.io.reads), "num");
    cell(row, String(f.io.writes), "num");
    cell(row, bytes(f.io.read_bytes), "num");
    cell(row, bytes(f.io.write_bytes), "num");
    cell(row, n ? String(Math.round((f.io.read_us + f.io.write_us) / n)) : "", "num");
    return row;
  }));
}

// --- Code ---

// One row per run of any kind: [kind, id, cancel kind, subject, what, state, account].
function runRows(r) {
  const out = [];
  for (const s of r.scripts.running.concat(r.scripts.recent)) {
    out.push({
      kind: "script", id: s.call, cancel: "script", subject: s.subject, what: s.script.slice(0, 12),
      state: s.running ? "running" : s.outcome, running: s.running, wall: s.wall_us, cpu: s.cpu_us,
      work: s.instructions + " instr.", memory: s.memory, read: s.input_bytes, written: s.output_bytes,
    });
  }
  for (const [kind, list] of [["storelet", r.storelets], ["active file", r.active_files]]) {
    for (const s of list.running.concat(list.recent)) {
      out.push({
        kind, id: s.run, cancel: "storelet", subject: s.subject,
        what: (s.active_file || s.module.slice(0, 12)) + (s.args.length ? " " + s.args.join(" ") : ""),
        state: s.state, running: s.running || s.state === "queued", wall: s.wall_us, cpu: s.cpu_us,
        work: s.fuel + " fuel", memory: s.peak_memory, read: s.read_bytes, written: s.write_bytes,
      });
    }
  }
  return out;
}

async function code() {
  let r;
  try {
    r = await api("runs");
  } catch (e) {
    $("code-status").textContent = e.message;
    return;
  }
  $("code-status").textContent = r.admin ? "Everyone's runs (you are an admin)." : "Your runs.";
  const rows = runRows(r);
  const running = [], recent = [];
  for (const x of rows) {
    const row = document.createElement("tr");
    row.dataset.kind = x.kind;
    row.dataset.id = String(x.id);
    cell(row, x.kind);
    cell(row, String(x.id));
    cell(row, x.subject);
    cell(row, x.what);
    cell(row, x.state, x.running ? "" : (x.state === "ok" || x.state.startsWith("exit 0") ? "good" : "bad"));
    cell(row, micros(x.wall), "num");
    cell(row, micros(x.cpu), "num");
    cell(row, x.work, "num");
    if (x.running) {
      const b = document.createElement("button");
      b.textContent = "Cancel";
      b.className = "cancel";
      b.addEventListener("click", async () => {
        b.disabled = true;
        try {
          await api("cancel?kind=" + x.cancel + "&id=" + x.id, { method: "POST" });
        } catch (e) {
          $("code-status").textContent = "cancel: " + e.message;
        }
        await code();
      });
      row.insertCell().append(b);
      running.push(row);
    } else {
      cell(row, bytes(x.memory), "num");
      cell(row, bytes(x.read), "num");
      cell(row, bytes(x.written), "num");
      recent.push(row);
    }
  }
  $("running").tBodies[0].replaceChildren(...running);
  $("recent").tBodies[0].replaceChildren(...recent);
}

start();
