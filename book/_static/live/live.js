/* The live panel of "From GPT-2 to Kimi K3" (book/live.md).
 * Runs the book's small byte models in this browser with onnxruntime-web, served from this
 * site (_static/live/ort/); nothing is fetched until the reader presses a button.
 * Also: a state-interference demo in plain JavaScript arithmetic (no model). */
(function () {
  "use strict";
  var script = document.currentScript;
  var BASE = script ? script.src.replace(/[^/]*$/, "") : "_static/live/";
  var MAX_NEW = 256, MAX_PROMPT = 200;
  var SHORT = { gpt2: "GPT-2 · KV cache", gated_deltanet: "Gated DeltaNet · state", k3: "Tiny K3 · hybrid" };
  function chartWidth(node) { return Math.max(320, Math.min(600, Math.round(node.clientWidth || 600))); }

  function el(tag, attrs, kids) {
    var e = document.createElement(tag);
    for (var k in (attrs || {})) {
      if (k === "text") e.textContent = attrs[k];
      else if (k === "html") e.innerHTML = attrs[k];
      else e.setAttribute(k, attrs[k]);
    }
    (kids || []).forEach(function (c) { if (c) e.appendChild(c); });
    return e;
  }
  function fmtBytes(b) {
    if (b < 1024) return b + " B";
    if (b < 1048576) return (b / 1024).toFixed(1) + " KiB";
    return (b / 1048576).toFixed(2) + " MiB";
  }
  function loadScript(src) {
    return new Promise(function (ok, fail) {
      var s = document.createElement("script");
      s.src = src; s.onload = ok; s.onerror = function () { fail(new Error("could not load " + src)); };
      document.head.appendChild(s);
    });
  }

  // ------------------------------------------------------------------ runtime and models
  var state = { ort: null, manifest: null, sessions: {}, running: false, stop: false,
                downloaded: {} };
  function record(name, bytes) { state.downloaded[name] = bytes; }

  async function fetchBytes(url, name) {
    var r = await fetch(url);
    if (!r.ok) throw new Error(url + ": HTTP " + r.status);
    var buf = new Uint8Array(await r.arrayBuffer());
    record(name, buf.byteLength);
    return buf;
  }
  async function runtime() {
    if (state.ort) return state.ort;
    if (typeof WebAssembly !== "object") throw new Error("no WebAssembly");
    if (typeof DecompressionStream !== "function") throw new Error("this browser cannot inflate the runtime (no DecompressionStream)");
    await loadScript(BASE + "ort/ort.wasm.min.js");
    var ort = window.ort;
    ort.env.wasm.wasmPaths = BASE + "ort/";
    // the WebAssembly is served gzipped (a quarter of its size): inflate it here
    var gz = await fetchBytes(BASE + "ort/ort-wasm-simd-threaded.wasm.gz", "ort-wasm-simd-threaded.wasm.gz");
    ort.env.wasm.wasmBinary = await new Response(new Blob([gz]).stream().pipeThrough(new DecompressionStream("gzip"))).arrayBuffer();
    ort.env.wasm.numThreads = 1;
    ort.env.wasm.proxy = false;
    ort.env.logLevel = "error";
    state.ort = ort;
    state.manifest = JSON.parse(new TextDecoder().decode(
      await fetchBytes(BASE + "models/live_models.json", "live_models.json")));
    return ort;
  }
  async function session(key) {
    var ort = await runtime();
    if (!state.sessions[key]) {
      var m = state.manifest.models[key];
      if (!m) throw new Error("this build of the book does not include that model");
      var bytes = await fetchBytes(BASE + "models/" + m.file, m.file);
      state.sessions[key] = await ort.InferenceSession.create(bytes, { executionProviders: ["wasm"] });
    }
    return state.sessions[key];
  }

  // A seeded generator (mulberry32) for sampling: reproducible in this browser for a seed.
  function rng(seed) {
    var a = seed >>> 0;
    return function () {
      a = (a + 0x6D2B79F5) >>> 0;
      var t = a;
      t = Math.imul(t ^ (t >>> 15), t | 1);
      t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
      return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
    };
  }
  function pick(logits, temperature, rand) {
    var best = 0;
    for (var i = 1; i < logits.length; i++) if (logits[i] > logits[best]) best = i;
    if (temperature <= 0) return best;
    var p = new Float64Array(logits.length), sum = 0;
    for (var j = 0; j < logits.length; j++) { p[j] = Math.exp((logits[j] - logits[best]) / temperature); sum += p[j]; }
    var u = rand() * sum;
    for (var k = 0; k < p.length; k++) { u -= p[k]; if (u <= 0) return k; }
    return best;
  }

  // One decode step: feed one byte, get the logits and the cache after it.
  function emptyCache(ort, m) {
    var feeds = {};
    m.inputs.forEach(function (inp) {
      var shape = inp.shape.map(function (d) { return d < 0 ? 0 : d; });
      var n = shape.reduce(function (a, b) { return a * b; }, 1);
      feeds[inp.name] = new ort.Tensor("float32", new Float32Array(n), shape);
    });
    return feeds;
  }
  function heldBytes(cache) {
    var b = 0;
    for (var k in cache) b += cache[k].data.byteLength;
    return b;
  }

  async function generate(ui) {
    if (state.running) return;
    state.running = true; state.stop = false;
    ui.setBusy(true);
    var key = ui.model.value, greedy = ui.mode.value === "greedy";
    var temperature = greedy ? 0 : Math.min(2, Math.max(0.05, parseFloat(ui.temp.value) || 0.8));
    var seed = Math.max(0, Math.min(2147483647, parseInt(ui.seed.value, 10) || 0));
    var nNew = Math.max(1, Math.min(MAX_NEW, parseInt(ui.count.value, 10) || 32));
    var prompt = new TextEncoder().encode(ui.prompt.value.slice(0, MAX_PROMPT));
    var t0 = performance.now();
    try {
      ui.status("Loading the runtime and the model (first use only)…", "loading");
      var sess = await session(key);
      var ort = state.ort, m = state.manifest.models[key];
      if (prompt.length < 1) prompt = new Uint8Array([10]);
      var limit = m.block_size - prompt.length;
      if (nNew > limit) nNew = Math.max(0, limit);
      var cache = emptyCache(ort, m), rand = rng(seed), ids = [], times = [];
      var length = 0, logits = null, firstTokenMs = null;
      ui.startRun(m, prompt);
      var all = Array.from(prompt);
      for (var i = 0; ids.length < nNew && !state.stop; i++) {
        var tok = all[i];
        var feeds = Object.assign({ token: new ort.Tensor("int64", BigInt64Array.from([BigInt(tok)]), [1, 1]) }, cache);
        var ts = performance.now();
        var out = await sess.run(feeds);
        var dt = performance.now() - ts;
        length += 1;
        cache = {};
        m.inputs.forEach(function (inp) { cache[inp.name] = out[inp.name + "_out"]; });
        logits = out.logits.data;
        if (i >= prompt.length - 1) {
          var next = pick(logits, temperature, rand);
          ids.push(next); all.push(next); times.push(dt);
          if (firstTokenMs === null) firstTokenMs = performance.now() - t0;
        }
        ui.step(m, length, heldBytes(cache), ids, times, firstTokenMs, i < prompt.length - 1);
        await new Promise(function (r) { setTimeout(r, 0); });   // let the page breathe
      }
      ui.done(ids, times, firstTokenMs, state.stop);
    } catch (err) {
      ui.status("Could not run the model here: " + err.message, "error");
      ui.fallback(true);
    } finally {
      state.running = false;
      ui.setBusy(false);
    }
  }

  // ------------------------------------------------------------------ the generation panel
  function panel(root) {
    var ui = {};
    ui.prompt = el("textarea", { id: "live-prompt", rows: "2", maxlength: String(MAX_PROMPT),
                                 "aria-label": "Prompt" });
    ui.prompt.value = "And it came to pass, when ";
    ui.model = el("select", { id: "live-model", "aria-label": "Model" });
    [["gpt2", "GPT-2 (KV cache)"], ["gated_deltanet", "Gated DeltaNet (fixed state)"],
     ["k3", "Tiny Kimi K3 (hybrid)"]].forEach(function (o) {
      ui.model.appendChild(el("option", { value: o[0], text: o[1] }));
    });
    ui.mode = el("select", { id: "live-mode", "aria-label": "Decoding" });
    ui.mode.appendChild(el("option", { value: "greedy", text: "greedy" }));
    ui.mode.appendChild(el("option", { value: "sample", text: "sampled" }));
    ui.temp = el("input", { id: "live-temp", type: "number", min: "0.05", max: "2", step: "0.05", value: "0.8", "aria-label": "Temperature" });
    ui.seed = el("input", { id: "live-seed", type: "number", min: "0", max: "2147483647", step: "1", value: "0", "aria-label": "Seed" });
    ui.count = el("input", { id: "live-count", type: "number", min: "1", max: String(MAX_NEW), step: "1", value: "64", "aria-label": "New bytes" });
    ui.go = el("button", { id: "live-go", type: "button", text: "Generate" });
    ui.halt = el("button", { id: "live-stop", type: "button", text: "Stop", disabled: "" });
    ui.statusEl = el("p", { id: "live-status", class: "live-status", "aria-live": "polite",
                            text: "Nothing has been downloaded yet: the runtime and the model load when you press Generate." });
    ui.out = el("pre", { id: "live-output", class: "live-output" });
    ui.promptSpan = el("span", { class: "live-prompt-text" });
    ui.genSpan = el("span", { class: "live-gen-text" });
    ui.out.appendChild(ui.promptSpan); ui.out.appendChild(ui.genSpan);
    ui.memTable = el("table", { id: "live-memory", class: "live-table" });
    ui.chart = el("div", { id: "live-chart", class: "live-chart", role: "img",
                           "aria-label": "Bytes each model holds against tokens seen" });
    ui.stats = el("p", { id: "live-stats", class: "live-stats" });
    function lab(text, input) { return el("label", { class: "live-field" }, [el("span", { text: text }), input]); }
    root.appendChild(el("div", { class: "live-controls" }, [
      lab("Prompt", ui.prompt),
      el("div", { class: "live-row" }, [lab("Model", ui.model), lab("Decoding", ui.mode),
        lab("Temperature", ui.temp), lab("Seed", ui.seed), lab("New bytes", ui.count)]),
      el("div", { class: "live-row" }, [ui.go, ui.halt])]));
    root.appendChild(ui.statusEl);
    root.appendChild(ui.out);
    root.appendChild(ui.stats);
    root.appendChild(ui.memTable);
    root.appendChild(ui.chart);

    var hist = [];  // [tokens, measured bytes] of the running model
    ui.status = function (text, kind) { ui.statusEl.textContent = text; ui.statusEl.setAttribute("data-state", kind || ""); };
    ui.setBusy = function (busy) {
      ui.go.disabled = busy; ui.halt.disabled = !busy; root.setAttribute("data-busy", busy ? "1" : "0");
      if (busy) ui.halt.removeAttribute("disabled"); else ui.halt.setAttribute("disabled", "");
    };
    ui.fallback = function (show) {
      var fb = document.getElementById("live-fallback");
      if (fb) fb.hidden = !show;
    };
    ui.startRun = function (m, prompt) {
      hist = [];
      ui.promptSpan.textContent = new TextDecoder().decode(prompt);
      ui.genSpan.textContent = "";
      ui.out.removeAttribute("data-ids");
      ui.status("Running " + m.label + "…", "running");
    };
    ui.step = function (m, length, measured, ids, times, firstMs, prefill) {
      hist.push([length, measured]);
      ui.genSpan.textContent = new TextDecoder().decode(new Uint8Array(ids));
      ui.out.setAttribute("data-ids", ids.join(","));
      var acc = m.accounting.fixed + m.accounting.per_token * length;
      ui.memTable.setAttribute("data-tokens", String(length));
      ui.memTable.setAttribute("data-measured", String(measured));
      ui.memTable.setAttribute("data-accounting", String(acc));
      renderTable(length, m, measured);
      if (length % 4 === 0 || !prefill) renderChart(m, length);
      var ms = times.length ? times[times.length - 1] : 0;
      ui.stats.textContent = (prefill ? "reading the prompt · " : "") + "token " + length +
        (times.length ? " · last step " + ms.toFixed(1) + " ms" : "");
    };
    ui.done = function (ids, times, firstMs, stopped) {
      var sorted = times.slice().sort(function (a, b) { return a - b; });
      var med = sorted.length ? sorted[Math.floor(sorted.length / 2)] : 0;
      var tps = med > 0 ? 1000 / med : 0;
      ui.stats.setAttribute("data-first-ms", firstMs === null ? "" : firstMs.toFixed(1));
      ui.stats.setAttribute("data-tps", tps.toFixed(1));
      ui.stats.textContent = ids.length + " bytes · first byte after " + (firstMs || 0).toFixed(0) +
        " ms (includes loading) · median step " + med.toFixed(1) + " ms ≈ " + tps.toFixed(0) +
        " bytes/s in this browser";
      // what this page fetched for the panel, as the browser counts it (runtime included)
      (performance.getEntriesByType ? performance.getEntriesByType("resource") : []).forEach(function (e) {
        if (/\/live\/(ort|models)\//.test(e.name)) {
          state.downloaded[e.name.replace(/^.*\//, "")] = e.encodedBodySize || e.decodedBodySize || state.downloaded[e.name.replace(/^.*\//, "")] || 0;
        }
      });
      var dl = Object.keys(state.downloaded).map(function (k) { return k + " " + fmtBytes(state.downloaded[k]); });
      ui.status((stopped ? "Stopped. " : "Done. ") + "Downloaded so far: " + dl.join(", ") + ".", "done");
      ui.statusEl.setAttribute("data-downloaded", JSON.stringify(state.downloaded));
    };
    function renderTable(length, current, measured) {
      var models = state.manifest.models;
      var rows = [el("tr", {}, [el("th", { text: "Model" }), el("th", { text: "Accounting, " + length + " tokens" }),
                                el("th", { text: "Held here" })])];
      Object.keys(models).forEach(function (k) {
        var m = models[k], acc = m.accounting.fixed + m.accounting.per_token * length;
        var here = m === current;
        rows.push(el("tr", here ? { class: "live-current" } : {}, [
          el("td", { text: SHORT[k] || m.label }), el("td", { text: fmtBytes(acc) }),
          el("td", here ? { text: fmtBytes(measured), "data-bytes": String(measured) } : { text: "–" })]));
      });
      ui.memTable.replaceChildren.apply(ui.memTable, rows);
    }
    function renderChart(current, length) {
      var models = state.manifest.models, keys = Object.keys(models);
      var W = chartWidth(ui.chart), H = 220, L = 56, R = 10, T = 10, B = 30;
      var xmax = Math.max(32, length, current.block_size === undefined ? 32 : Math.min(current.block_size, Math.max(64, 2 * length)));
      var ymax = 1;
      keys.forEach(function (k) { var a = models[k].accounting; ymax = Math.max(ymax, a.fixed + a.per_token * xmax); });
      function X(t) { return L + (W - L - R) * t / xmax; }
      function Y(b) { return H - B - (H - B - T) * b / ymax; }
      var s = '<svg viewBox="0 0 ' + W + ' ' + H + '" preserveAspectRatio="xMidYMid meet" width="100%">';
      s += '<line class="live-axis" x1="' + L + '" y1="' + (H - B) + '" x2="' + (W - R) + '" y2="' + (H - B) + '"/>';
      s += '<line class="live-axis" x1="' + L + '" y1="' + T + '" x2="' + L + '" y2="' + (H - B) + '"/>';
      s += '<text class="live-tick" x="' + (W - R) + '" y="' + (H - 8) + '" text-anchor="end">' + xmax + ' tokens</text>';
      s += '<text class="live-tick" x="' + L + '" y="' + (H - 8) + '" text-anchor="start">0</text>';
      s += '<text class="live-tick" x="' + (L - 4) + '" y="' + (T + 10) + '" text-anchor="end">' + fmtBytes(ymax).replace(" ", "\u00a0") + '</text>';
      keys.forEach(function (k, i) {
        var a = models[k].accounting;
        s += '<line class="live-acc live-c' + i + '" x1="' + X(0) + '" y1="' + Y(a.fixed) + '" x2="' + X(xmax) + '" y2="' + Y(a.fixed + a.per_token * xmax) + '"/>';
        if (models[k] === current && hist.length) {
          s += '<polyline class="live-meas live-c' + i + '" points="' + hist.map(function (p) { return X(p[0]) + "," + Y(p[1]); }).join(" ") + '"/>';
        }
      });
      s += '</svg>';
      var legend = keys.map(function (k, i) {
        return '<span class="live-key live-c' + i + '"><i></i>' + (SHORT[k] || models[k].label) + '</span>';
      }).join("");
      ui.chart.innerHTML = s + '<div class="live-legend">' + legend +
        '<span class="live-note">dashed: the accounting · solid: bytes held here, token by token</span></div>';
    }
    ui.go.addEventListener("click", function () { generate(ui); });
    ui.halt.addEventListener("click", function () { state.stop = true; });
    return ui;
  }

  // ------------------------------------------------------------------ state interference
  // Plain JavaScript arithmetic (no model): N random unit keys and values of dimension D are
  // written into a D x D state S with the additive rule (S += k^T v) and with the delta rule
  // (S += k^T (v - k S), beta = 1), then every key reads back r = k S.
  function interference(root) {
    var nIn = el("input", { id: "live-n", type: "range", min: "1", max: "64", step: "1", value: "12", "aria-label": "Pairs written (N)" });
    var dIn = el("input", { id: "live-d", type: "range", min: "2", max: "32", step: "1", value: "16", "aria-label": "State width (D)" });
    var nOut = el("output", {}), dOut = el("output", {});
    var res = el("p", { id: "live-interference", class: "live-stats" });
    var chart = el("div", { class: "live-chart", role: "img", "aria-label": "Read-back error against pairs written" });
    root.appendChild(el("div", { class: "live-row" }, [
      el("label", { class: "live-field live-range" }, [el("span", { text: "Pairs written N " }), nOut, nIn]),
      el("label", { class: "live-field live-range" }, [el("span", { text: "State width D " }), dOut, dIn])]));
    root.appendChild(res); root.appendChild(chart);
    function unit(r, D) {
      var v = new Float64Array(D), s = 0;
      for (var i = 0; i < D; i++) { var u1 = Math.max(r(), 1e-12), u2 = r(); v[i] = Math.sqrt(-2 * Math.log(u1)) * Math.cos(2 * Math.PI * u2); s += v[i] * v[i]; }
      s = Math.sqrt(s); for (var j = 0; j < D; j++) v[j] /= s; return v;
    }
    function readErr(N, D, delta) {
      var r = rng(1234 + 7 * D), ks = [], vs = [], S = new Float64Array(D * D), i, a, b;
      for (i = 0; i < N; i++) { ks.push(unit(r, D)); vs.push(unit(r, D)); }
      for (i = 0; i < N; i++) {
        var k = ks[i], u = Float64Array.from(vs[i]);
        if (delta) for (b = 0; b < D; b++) { var kv = 0; for (a = 0; a < D; a++) kv += k[a] * S[a * D + b]; u[b] -= kv; }
        for (a = 0; a < D; a++) for (b = 0; b < D; b++) S[a * D + b] += k[a] * u[b];
      }
      var err = 0;
      for (i = 0; i < N; i++) {
        var e = 0;
        for (b = 0; b < D; b++) { var o = 0; for (a = 0; a < D; a++) o += ks[i][a] * S[a * D + b]; e += (o - vs[i][b]) * (o - vs[i][b]); }
        err += Math.sqrt(e);
      }
      return err / N;
    }
    function draw() {
      var N = +nIn.value, D = +dIn.value;
      nOut.textContent = N; dOut.textContent = D;
      var add = readErr(N, D, false), del = readErr(N, D, true);
      res.textContent = "Mean read-back error |k S − v| over the " + N + " pairs: additive " + add.toFixed(3) +
        ", delta rule " + del.toFixed(3) + " (D = " + D + ").";
      res.setAttribute("data-additive", add.toFixed(6)); res.setAttribute("data-delta", del.toFixed(6));
      var W = chartWidth(chart), H = 200, L = 40, R = 10, T = 10, B = 30, xs = [], n;
      for (n = 1; n <= 64; n++) xs.push([n, readErr(n, D, false), readErr(n, D, true)]);
      var ymax = 0.1;
      xs.forEach(function (p) { ymax = Math.max(ymax, p[1] * 1.05, p[2] * 1.05); });
      function X(t) { return L + (W - L - R) * (t - 1) / 63; }
      function Y(e) { return H - B - (H - B - T) * Math.min(e, ymax) / ymax; }
      var s = '<svg viewBox="0 0 ' + W + ' ' + H + '" width="100%">';
      s += '<line class="live-axis" x1="' + L + '" y1="' + (H - B) + '" x2="' + (W - R) + '" y2="' + (H - B) + '"/>';
      s += '<line class="live-axis" x1="' + L + '" y1="' + T + '" x2="' + L + '" y2="' + (H - B) + '"/>';
      s += '<line class="live-mark" x1="' + X(D) + '" y1="' + T + '" x2="' + X(D) + '" y2="' + (H - B) + '"/>';
      s += '<text class="live-tick" x="' + (X(D) + 3) + '" y="' + (H - B - 6) + '" text-anchor="start">N = D</text>';
      s += '<polyline class="live-meas live-c0" points="' + xs.map(function (p) { return X(p[0]) + "," + Y(p[1]); }).join(" ") + '"/>';
      s += '<polyline class="live-meas live-c1" points="' + xs.map(function (p) { return X(p[0]) + "," + Y(p[2]); }).join(" ") + '"/>';
      s += '<circle class="live-c0" r="4" cx="' + X(N) + '" cy="' + Y(add) + '"/><circle class="live-c1" r="4" cx="' + X(N) + '" cy="' + Y(del) + '"/>';
      s += '<text class="live-tick" x="' + (L + 4) + '" y="' + (T + 10) + '">read-back error</text>';
      s += '<text class="live-tick" x="' + L + '" y="' + (H - 8) + '">1</text><text class="live-tick" x="' + (W - R) + '" y="' + (H - 8) + '" text-anchor="end">64 pairs</text>';
      s += '</svg>';
      chart.innerHTML = s + '<div class="live-legend"><span class="live-key live-c0"><i></i>additive</span><span class="live-key live-c1"><i></i>delta rule</span></div>';
    }
    nIn.addEventListener("input", draw); dIn.addEventListener("input", draw);
    draw();
  }

  function init() {
    var root = document.getElementById("live-panel");
    if (root && !root.getAttribute("data-ready")) {
      root.setAttribute("data-ready", "1");
      if (typeof WebAssembly !== "object") {
        root.appendChild(el("p", { class: "live-status", "data-state": "error",
          text: "This browser has no WebAssembly, so the models cannot run here. The figures below are the book's static versions." }));
        var fb = document.getElementById("live-fallback"); if (fb) fb.hidden = false;
      } else {
        panel(root);
      }
    }
    var inter = document.getElementById("live-interference-panel");
    if (inter && !inter.getAttribute("data-ready")) { inter.setAttribute("data-ready", "1"); interference(inter); }
  }
  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", init); else init();
})();
