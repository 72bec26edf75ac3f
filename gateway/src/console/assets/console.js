// The console's one script: a thin client over /console/api/* and (for an operator) /admin/*.
// Every value is written with textContent (never as HTML); the session is an HttpOnly cookie
// the script never sees; POSTs are same-origin fetches (the gateway checks Origin).
"use strict";
(function () {
  const $ = (id) => document.getElementById(id);
  const state = { role: null, key: null, view: "overview", timers: [], lastUsage: null, action: null };

  async function call(path, options) {
    const resp = await fetch(path, Object.assign({ credentials: "same-origin" }, options || {}));
    const text = await resp.text();
    let body = null;
    try { body = text ? JSON.parse(text) : null; } catch (_) { body = text; }
    if (resp.status === 401 && !path.startsWith("/console/login")) { showSignIn(""); }
    if (!resp.ok) {
      const msg = body && body.error && body.error.message ? body.error.message : `${resp.status} ${text}`;
      const err = new Error(msg); err.status = resp.status; throw err;
    }
    return body;
  }
  const post = (path, body) => call(path, {
    method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify(body || {}),
  });

  function cell(row, text, cls) {
    const td = document.createElement("td");
    td.textContent = text === null || text === undefined ? "–" : String(text);
    if (cls) td.className = cls;
    row.appendChild(td);
    return td;
  }
  function fill(tableId, rows, render) {
    const body = $(tableId).querySelector("tbody");
    body.replaceChildren(...rows.map((r) => { const tr = document.createElement("tr"); render(tr, r); return tr; }));
  }
  const fmt = (n, digits) => (n === null || n === undefined ? "–" : Number(n).toFixed(digits === undefined ? 1 : digits));
  const ago = (unix) => (unix ? `${Math.max(0, Math.round(Date.now() / 1000 - unix))} s ago` : "–");

  // ---- sign-in -------------------------------------------------------------------------------
  function showSignIn(message) {
    stopTimers();
    state.role = null;
    $("signin").hidden = false; $("tabs").hidden = true; $("signout").hidden = true;
    document.querySelectorAll(".view").forEach((v) => { v.hidden = true; });
    $("who").textContent = "";
    $("signin-error").textContent = message || "";
  }
  function showApp(session) {
    state.role = session.role; state.key = session.key;
    $("signin").hidden = true; $("tabs").hidden = false; $("signout").hidden = false;
    $("who").textContent = session.role === "operator" ? "operator" : `team member · key ${session.key}`;
    document.querySelectorAll("[data-operator]").forEach((b) => { b.hidden = session.role !== "operator"; });
    show("overview");
  }
  $("signin-form").addEventListener("submit", async (e) => {
    e.preventDefault();
    const token = $("token").value;
    $("token").value = "";
    try { showApp(await post("/console/login", { token })); } catch (err) { showSignIn(err.message); }
  });
  $("signout").addEventListener("click", async () => {
    try { await post("/console/logout"); } finally { showSignIn("signed out"); }
  });

  // ---- views ---------------------------------------------------------------------------------
  function stopTimers() { state.timers.forEach(clearInterval); state.timers = []; }
  function every(ms, f) { f(); state.timers.push(setInterval(f, ms)); }
  function show(view) {
    stopTimers();
    state.view = view;
    document.querySelectorAll(".view").forEach((v) => { v.hidden = v.id !== `view-${view}`; });
    document.querySelectorAll("#tabs button").forEach((b) => b.classList.toggle("active", b.dataset.view === view));
    const views = { overview: [1500, overview], usage: [10000, usage], events: [2000, events], requests: [1500, requests],
      actions: [400, actions], settings: [0, settings] };
    const [ms, f] = views[view];
    if (ms) every(ms, guard(f)); else guard(f)();
  }
  const guard = (f) => () => f().catch((err) => { if (err.status !== 401) console.warn(err); });
  document.querySelectorAll("#tabs button").forEach((b) => b.addEventListener("click", () => show(b.dataset.view)));

  // ---- overview ------------------------------------------------------------------------------
  function phaseOf(s) {
    const sup = s.supervisor;
    if (!sup) return s.ready ? "ready" : "not ready";
    const st = typeof sup.state === "object" ? sup.state : { state: sup.state };
    return st.state;
  }
  // Each supervised group: the status's own `supervisor` (one group, or the operated model's),
  // else each group's (GROUPS_FILE).
  function groupsOf(s) {
    if (s.supervisor) return [{ name: (s.groups && s.groups[0] && s.groups[0].name) || "main", sup: s.supervisor }];
    return (s.groups || []).filter((g) => g.supervisor).map((g) => ({ name: g.name, sup: g.supervisor }));
  }
  async function overview() {
    const s = await call("/console/api/status");
    const groups = groupsOf(s);
    const sup = groups.length ? groups[0].sup : {};
    const phase = groups.length > 1
      ? groups.map((g) => `${g.name}: ${phaseOf({ supervisor: g.sup })}`).join(" · ")
      : phaseOf(s);
    $("state").textContent = phase; $("state").className = `big state-${phaseOf(s)}`;
    $("epoch").textContent = sup.epoch === undefined ? "–" : sup.epoch;
    $("mode").textContent = s.mode || "–";
    $("since").textContent = ago(sup.state_since_unix);
    $("vllm").textContent = (s.vllm && s.vllm.version) || "–";
    $("model").textContent = s.model || "–";
    $("in-use").textContent = s.admission.in_flight; $("cap").textContent = s.admission.capacity;
    $("queued").textContent = s.admission.queued;
    $("oldest").textContent = s.admission.oldest_wait_s === null ? "–" : `${s.admission.oldest_wait_s} s`;
    $("tps-out").textContent = fmt(s.tokens_per_s);
    const ranks = groups.flatMap((g) => (g.sup.ranks || []).map((r) => [g.name, r]));
    fill("ranks", ranks, (tr, [name, r]) => {
      cell(tr, name); cell(tr, r.rank); cell(tr, r.node); cell(tr, r.container || (r.pid ? `pid ${r.pid}` : null));
      cell(tr, r.running ? "running" : "stopped");
    });
    const gpus = new Map((sup.gpus || []).map((n) => [n.node, n.gpus]));
    const nodes = [];
    (sup.memory || []).forEach((m) => {
      const list = gpus.get(m.node) || [null];
      list.forEach((g) => nodes.push([m, g]));
    });
    fill("nodes", nodes, (tr, [m, g]) => {
      cell(tr, m.node); cell(tr, m.mem_available_gib === null ? null : `${fmt(m.mem_available_gib)} GiB`);
      cell(tr, g ? g.index : "no nvidia-smi"); cell(tr, g && g.utilization_pct !== null ? `${fmt(g.utilization_pct, 0)} %` : null);
      cell(tr, g && g.power_w !== null ? `${fmt(g.power_w, 0)} W` : null);
      cell(tr, g && g.temperature_c !== null ? `${fmt(g.temperature_c, 0)} °C` : null);
    });
    $("headroom").textContent = sup.headroom_gib === undefined || sup.headroom_gib === null ? "–" : `${fmt(sup.headroom_gib)} GiB`;
    // Tokens in and out per second from the usage the store holds (finished requests).
    const u = await call("/console/api/usage?window=hour");
    const now = Date.now() / 1000;
    if (state.lastUsage) {
      const dt = Math.max(0.5, now - state.lastUsage.at);
      $("tps-in").textContent = fmt((u.total.prompt - state.lastUsage.prompt) / dt);
      $("tps-done").textContent = fmt((u.total.completion - state.lastUsage.completion) / dt);
    }
    state.lastUsage = { at: now, prompt: u.total.prompt, completion: u.total.completion };
  }

  // ---- usage ---------------------------------------------------------------------------------
  function buckets(series, since, until, key) {
    const step = series.step_s;
    const byAt = new Map();
    for (const p of series.points.filter((p) => !key || p.key === key)) {
      const b = byAt.get(p.at) || { at: p.at, prompt: 0, completion: 0, requests: 0 };
      b.prompt += p.prompt; b.completion += p.completion; b.requests += p.requests;
      byAt.set(p.at, b);
    }
    const out = [];
    for (let at = since; at <= until; at += step) out.push(byAt.get(at) || { at, prompt: 0, completion: 0, requests: 0 });
    return out;
  }
  async function usage() {
    const win = $("window").value;
    const u = await call(`/console/api/usage?window=${encodeURIComponent(win)}&series=1`);
    const perKey = new Map();
    for (const r of u.rows) {
      const k = perKey.get(r.key) || { key: r.key, requests: 0, prompt: 0, completion: 0, refusals: 0 };
      k.requests += r.requests; k.prompt += r.prompt; k.completion += r.completion; k.refusals += r.refusals;
      perKey.set(r.key, k);
    }
    const rows = [...perKey.values()];
    fill("usage", rows, (tr, k) => { cell(tr, k.key); cell(tr, k.requests); cell(tr, k.prompt); cell(tr, k.completion); cell(tr, k.refusals); });
    $("total-requests").textContent = u.total.requests; $("total-prompt").textContent = u.total.prompt;
    $("total-completion").textContent = u.total.completion; $("total-refusals").textContent = u.total.refusals;
    const pick = $("usage-key");
    const chosen = pick.value;
    pick.replaceChildren(pick.options[0], ...rows.map((k) => {
      const o = document.createElement("option"); o.value = k.key; o.textContent = k.key; return o;
    }));
    pick.value = rows.some((k) => k.key === chosen) ? chosen : "";
    window.SparkCharts.bars($("chart"), buckets(u.series, u.since, u.until, pick.value), u.series.step_s);
    const csv = ["key,model,route,requests,prompt,completion,refusals"]
      .concat(u.rows.map((r) => [r.key, r.model, r.route, r.requests, r.prompt, r.completion, r.refusals].join(",")));
    $("csv").href = "data:text/csv;charset=utf-8," + encodeURIComponent(csv.join("\n") + "\n");
    $("csv").download = `usage-${win}.csv`;
    const q = await call("/console/api/quotas");
    fill("quotas", q.quotas, (tr, r) => { cell(tr, r.key); cell(tr, r.limit); cell(tr, r.quota); cell(tr, r.used); });
  }
  $("window").addEventListener("change", guard(usage));
  $("usage-key").addEventListener("change", guard(usage));

  // ---- events and requests -------------------------------------------------------------------
  async function events() {
    const e = await call(`/admin/events?level=${$("level").value}`);
    fill("events", e.events, (tr, r) => {
      tr.className = `level-${r.level}`;
      cell(tr, new Date(r.at_ms).toISOString().replace("T", " ").slice(0, 19)); cell(tr, r.level);
      cell(tr, r.event); cell(tr, r.text);
      const td = cell(tr, "");
      if (r.event === "group_lost" && r.group !== undefined) {
        const a = document.createElement("a");
        a.href = `/admin/diagnostics?group=${encodeURIComponent(r.group)}&epoch=${r.epoch}`;
        a.download = `diagnostics-${r.group}-${r.epoch}.txt`; a.textContent = "bundle";
        td.replaceChildren(a);
      }
    });
  }
  $("level").addEventListener("change", guard(events));
  async function requests() {
    const r = await call("/admin/requests");
    $("req-queued").textContent = r.queue.queued;
    fill("requests", r.in_flight, (tr, q) => {
      cell(tr, q.key); cell(tr, q.route); cell(tr, q.model); cell(tr, q.group); cell(tr, `${q.elapsed_s} s`);
      cell(tr, q.streamed_events); cell(tr, q.resumed > 0 ? `yes (${q.resumed})` : "no"); cell(tr, q.request_id);
    });
  }

  // ---- actions -------------------------------------------------------------------------------
  function describe(s) {
    if (s.swap && s.swap.phase && s.swap.phase !== "serving") return `swapping: ${s.swap.phase}`;
    const sup = s.supervisor;
    if (!sup) return s.ready ? "ready" : "not ready";
    const st = typeof sup.state === "object" ? sup.state : { state: sup.state };
    const running = (sup.ranks || []).filter((r) => r.running).length;
    if (st.state === "ready" && !s.admission.open) return `draining: ${s.admission.in_flight} in flight`;
    switch (st.state) {
      case "starting": return `starting epoch ${sup.epoch}: ${running}/${(sup.ranks || []).length} ranks up`;
      case "ready": return `ready (epoch ${sup.epoch}, mode ${sup.mode})`;
      case "backoff": return `back-off: ${st.reason || ""}`;
      case "failed": return `failed: ${st.reason || ""}`;
      default: return st.reason ? `${st.state}: ${st.reason}` : st.state;
    }
  }
  const ASK = {
    restart: ["Restart the group? Requests in flight finish first.", () => post("/admin/restart")],
    "restart-force": ["Restart the group now? Requests in flight are cut and continued.", () => post("/admin/restart?force=1")],
    stop: ["Stop the group? Requests are refused until it is started.", () => post("/admin/stop")],
    start: ["Start the group?", () => post("/admin/start")],
    spec: [null, () => post("/admin/spec", { mode: $("spec-mode").value })],
  };
  async function act(name) {
    const [text, send] = ASK[name];
    $("confirm-text").textContent = text || `Switch speculation to ${$("spec-mode").value}? The group restarts in that mode.`;
    const dialog = $("confirm");
    dialog.returnValue = "";
    dialog.showModal();
    await new Promise((done) => dialog.addEventListener("close", done, { once: true }));
    if (dialog.returnValue !== "ok") return;
    const before = await call("/console/api/status");
    $("phases").replaceChildren(); $("outcome").textContent = "";
    const from = Date.now();
    try { await send(); } catch (err) { $("outcome").textContent = `refused: ${err.message}`; return; }
    // Watched from the gateway's answer on: the phases are the command's, not the state before.
    state.action = { name, from, epoch: (before.supervisor || {}).epoch || 0, last: null, goalMode: name === "spec" ? $("spec-mode").value : null };
  }
  document.querySelectorAll("[data-action]").forEach((b) => b.addEventListener("click", () => act(b.dataset.action).catch((e) => { $("outcome").textContent = e.message; })));
  async function actions() {
    if (!$("spec-mode").options.length) {
      const spec = await call("/admin/spec");
      spec.modes.forEach((m) => { const o = document.createElement("option"); o.value = m.mode; o.textContent = m.mode; $("spec-mode").appendChild(o); });
      $("spec-mode").value = spec.mode;
    }
    const a = state.action;
    if (!a) return;
    const s = await call("/console/api/status");
    const phase = describe(s);
    if (phase !== a.last) {
      const li = document.createElement("li"); li.textContent = phase; $("phases").appendChild(li); a.last = phase;
    }
    const sup = s.supervisor || {};
    const st = typeof sup.state === "object" ? sup.state.state : sup.state;
    const secs = ((Date.now() - a.from) / 1000).toFixed(1);
    if (a.name === "stop" && st === "stopped") { $("outcome").textContent = `stopped in ${secs} s`; state.action = null; }
    else if (st === "failed") { $("outcome").textContent = `failed: ${sup.state.reason || "see Events"}`; state.action = null; }
    else if (a.name !== "stop" && st === "ready" && sup.epoch > a.epoch && (!a.goalMode || sup.mode === a.goalMode)) {
      $("outcome").textContent = `ready in ${secs} s`; state.action = null;
    }
  }

  // ---- settings ------------------------------------------------------------------------------
  async function settings() {
    const c = await call("/admin/config");
    const list = Array.isArray(c) ? c.flatMap((m) => m.settings) : c.settings;
    fill("settings", list, (tr, s) => {
      cell(tr, s.name); cell(tr, s.value);
      const src = s.source || {};
      cell(tr, src.kind === "env-file" ? `${src.path}:${src.line}` : src.kind === "profile" ? `profile ${src.profile}` : src.kind);
    });
  }

  // ---- start ---------------------------------------------------------------------------------
  call("/console/api/session").then(showApp).catch(() => showSignIn(""));
})();
