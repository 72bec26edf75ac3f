// A stacked bar chart in SVG, drawn with DOM calls only (the console's CSP allows no inline
// style or script): one bar per bucket, prompt tokens below completion tokens. The chart's
// totals ride on the <svg> as data attributes, which the browser test reads.
"use strict";
window.SparkCharts = (function () {
  const NS = "http://www.w3.org/2000/svg";
  function el(name, attrs, text) {
    const e = document.createElementNS(NS, name);
    for (const [k, v] of Object.entries(attrs)) e.setAttribute(k, String(v));
    if (text !== undefined) e.textContent = text;
    return e;
  }
  function label(at, step) {
    const d = new Date(at * 1000);
    if (step >= 86400) return d.toISOString().slice(5, 10);
    return d.toISOString().slice(11, 16);
  }
  // buckets: [{at, prompt, completion, requests}] in time order, every bucket of the window.
  function bars(container, buckets, step) {
    const w = 720, h = 220, pad = 36;
    const svg = el("svg", { width: w, height: h, viewBox: `0 0 ${w} ${h}`, role: "img" });
    const totals = { prompt: 0, completion: 0, requests: 0 };
    let max = 1;
    for (const b of buckets) {
      totals.prompt += b.prompt; totals.completion += b.completion; totals.requests += b.requests;
      max = Math.max(max, b.prompt + b.completion);
    }
    const bw = (w - pad * 2) / Math.max(1, buckets.length);
    const scale = (h - pad * 2) / max;
    buckets.forEach((b, i) => {
      const x = pad + i * bw + 1;
      const hp = b.prompt * scale, hc = b.completion * scale;
      const title = `${label(b.at, step)}: ${b.prompt} prompt, ${b.completion} completion, ${b.requests} requests`;
      const g = el("g", {});
      g.appendChild(el("title", {}, title));
      g.appendChild(el("rect", { class: "prompt", x, y: h - pad - hp, width: Math.max(1, bw - 2), height: hp }));
      g.appendChild(el("rect", { class: "completion", x, y: h - pad - hp - hc, width: Math.max(1, bw - 2), height: hc }));
      svg.appendChild(g);
      if (buckets.length <= 24 || i % Math.ceil(buckets.length / 12) === 0) {
        svg.appendChild(el("text", { x, y: h - pad + 14 }, label(b.at, step)));
      }
    });
    svg.appendChild(el("text", { x: 4, y: 14 }, `max ${max} tokens per bucket`));
    svg.appendChild(el("text", { x: w - 260, y: 14 }, `total: ${totals.prompt} prompt · ${totals.completion} completion`));
    svg.dataset.prompt = totals.prompt;
    svg.dataset.completion = totals.completion;
    svg.dataset.requests = totals.requests;
    container.replaceChildren(svg);
    return totals;
  }
  return { bars };
})();
