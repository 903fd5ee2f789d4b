/* diag's HTML report: draws the charts described in the data island (#diag-data) with Chart.js.
   Strings from the data reach the page only through Chart.js (canvas text) or textContent, never
   as markup. When every chart is drawn, the body gets data-rendered=ok and data-render-ms; an
   error sets data-rendered="error" and lists the message in #diag-errors (see errors.js). */
(function () {
  "use strict";
  var t0 = performance.now();
  var PHASE_COLORS = {
    data: "#e4572e", H2D: "#f3a712", forward: "#4c78a8", backward: "#72b7b2",
    optimizer: "#54a24b", other: "#b0b7c3"
  };
  var PALETTE = ["#4c78a8", "#f58518", "#54a24b", "#e45756", "#72b7b2", "#eeca3b", "#b279a2",
                 "#ff9da6", "#9d755d", "#bab0ac"];
  var MEM_COLORS = ["#4c78a8", "#72b7b2", "#54a24b", "#f58518", "#b0b7c3"];

  function color(i) { return PALETTE[i % PALETTE.length]; }
  function phaseColor(name, i) { return PHASE_COLORS[name] || color(i); }

  function fmtMs(s) {
    if (s === null || s === undefined) { return "N/A"; }
    var v = s * 1000;
    return (v >= 100 ? v.toFixed(0) : v >= 1 ? v.toFixed(1) : v.toFixed(3)) + " ms";
  }
  function fmtBytes(n) {
    if (n === null || n === undefined) { return "N/A"; }
    var units = ["B", "KiB", "MiB", "GiB", "TiB"];
    var i = 0;
    while (Math.abs(n) >= 1024 && i < units.length - 1) { n /= 1024; i += 1; }
    return (i === 0 ? n.toFixed(0) : n.toFixed(2)) + " " + units[i];
  }
  function byteUnit(max) {
    var units = [["B", 1], ["KiB", 1024], ["MiB", 1048576], ["GiB", 1073741824], ["TiB", 1099511627776]];
    var u = units[0];
    for (var i = 0; i < units.length; i++) { if (max >= units[i][1]) { u = units[i]; } }
    return u;
  }
  function maxOf(arr) {
    var m = 0;
    arr.forEach(function (v) { if (v !== null && v > m) { m = v; } });
    return m;
  }
  function toMs(arr) { return arr.map(function (v) { return v === null ? null : v * 1000; }); }

  var base = {
    animation: false,
    responsive: true,
    maintainAspectRatio: false,
    normalized: true,
    plugins: { legend: { position: "bottom", labels: { boxWidth: 12 } } }
  };
  function opts(extra) {
    var o = JSON.parse(JSON.stringify(base));
    for (var k in extra) { if (Object.prototype.hasOwnProperty.call(extra, k)) { o[k] = extra[k]; } }
    return o;
  }

  var builders = {
    steps: function (c) {
      var datasets = c.phases.map(function (name, i) {
        return { type: "bar", label: name, data: toMs(c.series[name]), backgroundColor: phaseColor(name, i),
                 stack: "phases", barPercentage: 1.0, categoryPercentage: 1.0, order: 2 };
      });
      if (c.bucket > 1) {
        datasets.push({ type: "line", label: "max step", data: toMs(c.total.max), borderColor: "#c62828",
                        borderWidth: 1, pointRadius: 0, fill: false, order: 1 });
        datasets.push({ type: "line", label: "min step", data: toMs(c.total.min), borderColor: "#1d2430",
                        borderWidth: 1, borderDash: [3, 3], pointRadius: 0, fill: false, order: 1 });
      }
      return {
        type: "bar", data: { labels: c.x, datasets: datasets },
        options: opts({
          scales: { x: { stacked: true, title: { display: true, text: "step" }, ticks: { maxTicksLimit: 20 } },
                    y: { stacked: true, beginAtZero: true, title: { display: true, text: "ms" } } },
          plugins: base.plugins,
          interaction: { mode: "index", intersect: false }
        })
      };
    },
    stack: function (c) {
      var datasets = c.phases.map(function (name, i) {
        return { label: name, data: toMs(c.series[name]), backgroundColor: phaseColor(name, i),
                 barPercentage: 1.0, categoryPercentage: 1.0 };
      });
      return {
        type: "bar", data: { labels: c.x, datasets: datasets },
        options: opts({ scales: { x: { stacked: true, ticks: { maxTicksLimit: 20 } },
                                  y: { stacked: true, beginAtZero: true, title: { display: true, text: "ms" } } },
                        plugins: base.plugins, interaction: { mode: "index", intersect: false } })
      };
    },
    hist: function (c) {
      var labels = [];
      for (var i = 0; i < c.counts.length; i++) {
        labels.push(fmtMs((c.edges[i] + c.edges[Math.min(i + 1, c.edges.length - 1)]) / 2));
      }
      return {
        type: "bar",
        data: { labels: labels, datasets: [{ label: "steps", data: c.counts, backgroundColor: "#4c78a8",
                                             barPercentage: 1.0, categoryPercentage: 0.95 }] },
        options: opts({ plugins: { legend: { display: false } },
                        scales: { x: { title: { display: true, text: "step time" }, ticks: { maxTicksLimit: 12 } },
                                  y: { beginAtZero: true, title: { display: true, text: "steps" } } } })
      };
    },
    dist: function (c) {
      /* several distributions on shared bins (diag compare): each side's share of its steps per bin */
      var labels = [];
      for (var i = 0; i + 1 < c.edges.length; i++) {
        labels.push(fmtMs((c.edges[i] + c.edges[i + 1]) / 2));
      }
      if (c.overflow && labels.length) {
        labels[labels.length - 1] = "\u2265 " + fmtMs(c.edges[c.edges.length - 2]);
      }
      var datasets = c.sides.map(function (s, i) {
        return { label: s.label, data: s.share.map(function (v) { return v === null ? null : v * 100; }),
                 backgroundColor: color(i), barPercentage: 1.0, categoryPercentage: 0.9 };
      });
      return {
        type: "bar", data: { labels: labels, datasets: datasets },
        options: opts({ plugins: base.plugins, interaction: { mode: "index", intersect: false },
                        scales: { x: { title: { display: true, text: "step time" }, ticks: { maxTicksLimit: 12 } },
                                  y: { beginAtZero: true, title: { display: true, text: "% of steps" } } } })
      };
    },
    lines: function (c) {
      var bytes = c.unit === "bytes";
      var bu = ["", 1];
      if (bytes) {
        var top = 0;
        c.lines.forEach(function (l) { top = Math.max(top, maxOf(l.y), l.total || 0); });
        bu = byteUnit(top);
      }
      var scale = 1 / bu[1];
      var datasets = c.lines.map(function (l, i) {
        var pts = [];
        for (var j = 0; j < l.x.length; j++) {
          pts.push({ x: l.x[j], y: l.y[j] === null ? null : l.y[j] * scale });
        }
        return { label: l.label, data: pts, borderColor: color(i), backgroundColor: color(i),
                 borderWidth: 1.5, pointRadius: 0, spanGaps: false };
      });
      var total = null;
      c.lines.forEach(function (l) { if (l.total) { total = Math.max(total || 0, l.total); } });
      if (total && c.lines.length && c.lines[0].x.length) {
        var xs = c.lines[0].x;
        datasets.push({ label: "capacity", data: [{ x: xs[0], y: total * scale }, { x: xs[xs.length - 1], y: total * scale }],
                        borderColor: "#98a2b3", borderDash: [5, 4], borderWidth: 1, pointRadius: 0 });
      }
      var y = { beginAtZero: true, title: { display: true, text: bytes ? bu[0] : c.unit } };
      if (c.ymax) { y.max = c.ymax; }
      return {
        type: "line", data: { datasets: datasets },
        options: opts({ parsing: true, plugins: base.plugins,
                        scales: { x: { type: "linear", title: { display: true, text: c.xlabel || "" } }, y: y } })
      };
    },
    ranks: function (c) {
      var datasets = c.phases.map(function (name, i) {
        return {
          label: name, data: toMs(c.series[name]), backgroundColor: phaseColor(name, i),
          borderColor: function (ctx) { return ctx.dataIndex === c.highlight ? "#c62828" : "rgba(0,0,0,0)"; },
          borderWidth: function (ctx) { return ctx.dataIndex === c.highlight ? 3 : 0; }
        };
      });
      return {
        type: "bar", data: { labels: c.labels, datasets: datasets },
        options: opts({ indexAxis: "y", plugins: base.plugins,
                        scales: { x: { stacked: true, title: { display: true, text: "ms (median per step)" } },
                                  y: { stacked: true, ticks: { color: function (ctx) {
                                    return ctx.index === c.highlight ? "#c62828" : "#1d2430"; } } } } })
      };
    },
    breakdown: function (c) {
      var total = 0;
      c.values.forEach(function (v) { total += v || 0; });
      var bu = byteUnit(total);
      var datasets = c.labels.map(function (name, i) {
        return { label: name, data: [c.values[i] / bu[1]], backgroundColor: MEM_COLORS[i % MEM_COLORS.length] };
      });
      return {
        type: "bar", data: { labels: ["memory"], datasets: datasets },
        options: opts({ indexAxis: "y",
                        plugins: { legend: base.plugins.legend,
                                   tooltip: { callbacks: { label: function (ctx) {
                                     return ctx.dataset.label + ": " + fmtBytes(c.values[ctx.datasetIndex]); } } } },
                        scales: { x: { stacked: true, title: { display: true, text: bu[0] } }, y: { stacked: true } } })
      };
    },
    plan: function (c) {
      var bu = byteUnit(Math.max(maxOf(c.y), c.capacity || 0));
      var pts = c.x.map(function (b, i) { return { x: b, y: c.y[i] === null ? null : c.y[i] / bu[1] }; });
      var datasets = [{ label: "peak (replay)", data: pts, borderColor: "#4c78a8", backgroundColor: "#4c78a8",
                        pointRadius: 3 }];
      if (c.capacity && c.x.length) {
        datasets.push({ label: "usable", data: [{ x: c.x[0], y: c.capacity / bu[1] },
                                                { x: c.x[c.x.length - 1], y: c.capacity / bu[1] }],
                        borderColor: "#c62828", borderDash: [5, 4], pointRadius: 0 });
      }
      return {
        type: "line", data: { datasets: datasets },
        options: opts({ plugins: base.plugins,
                        scales: { x: { type: (c.x.length && c.x[0] > 0 && c.x[c.x.length - 1] / c.x[0] > 64) ?
                                            "logarithmic" : "linear", title: { display: true, text: "batch" } },
                                  y: { beginAtZero: true, title: { display: true, text: bu[0] } } } })
      };
    },
    cost: function (c) {
      return {
        type: "bar",
        data: { labels: c.labels, datasets: [{ label: "cost (USD)", data: c.cost, backgroundColor: "#54a24b" }] },
        options: opts({ indexAxis: "y",
                        plugins: { legend: { display: false },
                                   tooltip: { callbacks: { label: function (ctx) {
                                     return "$" + c.cost[ctx.dataIndex].toLocaleString() + ", " +
                                       c.hours[ctx.dataIndex].toPrecision(3) + " wall hours"; } } } },
                        scales: { x: { beginAtZero: true, title: { display: true, text: "USD" } } } })
      };
    }
  };

  function render() {
    var island = document.getElementById("diag-data");
    var data = JSON.parse(island.textContent);
    var specs = data.charts || {};
    var canvases = document.querySelectorAll("canvas[data-chart]");
    var drawn = 0;
    window.diagCharts = {};
    for (var i = 0; i < canvases.length; i++) {
      var canvas = canvases[i];
      var id = canvas.getAttribute("data-chart");
      var spec = specs[id];
      if (!spec || !builders[spec.type]) {
        window.diagRecordError("no chart data for " + id);
        continue;
      }
      window.diagCharts[id] = new Chart(canvas, builders[spec.type](spec));
      drawn += 1;
    }
    var body = document.body;
    body.setAttribute("data-charts", String(drawn));
    body.setAttribute("data-chart-ms", (performance.now() - t0).toFixed(1));
    body.setAttribute("data-render-ms", performance.now().toFixed(1));
    if (body.getAttribute("data-rendered") !== "error") {
      body.setAttribute("data-rendered", "ok");
    }
  }

  try {
    if (typeof Chart === "undefined") { throw new Error("the chart library did not load"); }
    render();
  } catch (e) {
    window.diagRecordError("error: " + (e && e.message ? e.message : e));
  }
})();
