// Interactive metric charts, drawn with the vendored uPlot (unimas/report/vendor/).
// unimas/report/charts.py has decided every chart, series, colour and dash; this only lines the points
// up on one x axis and hands them to uPlot, which gives hover values (all step charts follow one cursor),
// drag-to-zoom (double-click zooms out) and legend entries that hide or show their series. Labels come
// from metric, role and run names: uPlot writes them with textContent, never as HTML.
(function () {
  "use strict";
  const data = JSON.parse(document.getElementById("report-data").textContent);
  const HEIGHT = 230;
  const drawn = [];
  // Tick spacings of a step axis: whole steps only (1, 2, 5, 10, 20, 50, ...).
  const STEP_INCREMENTS = [...Array(8).keys()].flatMap((k) => [1, 2, 5].map((m) => m * 10 ** k));

  function el(tag, attrs, text) {
    const node = document.createElement(tag);
    for (const [key, value] of Object.entries(attrs || {})) node.setAttribute(key, value);
    if (text !== undefined) node.textContent = text;
    return node;
  }

  function fmt(value) {
    if (value === null || value === undefined) return "–";
    if (Number.isInteger(value) && Math.abs(value) < 1e6) return String(value);
    return Math.abs(value) >= 1e5 || (value !== 0 && Math.abs(value) < 1e-3) ? value.toExponential(3)
      : String(Number(value.toPrecision(4)));
  }

  // uPlot's data layout: one shared, ascending x array and per series a y array with null where it has no point.
  function aligned(chart) {
    const xs = [...new Set(chart.series.flatMap((s) => s.points.map((p) => p[0])))].sort((a, b) => a - b);
    const at = new Map(xs.map((x, i) => [x, i]));
    const ys = chart.series.map((s) => {
      const y = new Array(xs.length).fill(null);
      for (const [x, v] of s.points) y[at.get(x)] = v;
      return y;
    });
    return [xs, ...ys];
  }

  // Bars are centred on their x: the x range gets half a bar's width on each side, so no bar is cut.
  function barRange(u, min, max) {
    const xs = u.data[0];
    const half = xs.length > 1 ? (xs[xs.length - 1] - xs[0]) / (xs.length - 1) / 2 : 0.5;
    return [min - half, max + half];
  }

  function options(chart, figure, width, last) {
    const bars = chart.kind === "bars";
    return {
      title: chart.title,
      width,
      height: HEIGHT,
      scales: { x: bars ? { time: false, range: barRange } : { time: false } },
      cursor: bars ? {} : { sync: { key: "unimas-steps" } },
      legend: { live: true },
      axes: [{ label: chart.x_label || "step", incrs: bars ? undefined : STEP_INCREMENTS,
               values: (u, splits) => splits.map(fmt) },
             { label: chart.y_label || "", size: 62, values: (u, splits) => splits.map(fmt) }],
      series: [
        { label: chart.x_label || "step", value: (u, v) => fmt(v) },
        ...chart.series.map((s) => ({
          label: s.label,
          stroke: s.color,
          dash: s.dash,
          width: 1.5,
          spanGaps: true,
          fill: bars ? s.color + "55" : undefined,
          paths: bars ? uPlot.paths.bars({ size: [0.8, 60] }) : undefined,
          points: { show: !bars && s.points.length < 30, size: 5 },  // a short run's few points stay visible
          value: (u, v) => fmt(v),
        })),
      ],
      hooks: {
        // Off the chart, the legend shows the last step's values rather than blanks.
        setLegend: [(u) => { if (u.legend.idx == null && !bars) u.setLegend({ idx: last }, false); }],
        setScale: [(u, key) => {
          if (key === "x") figure.dataset.xRange = `${u.scales.x.min}..${u.scales.x.max}`;
        }],
      },
    };
  }

  function draw(box, chart) {
    const figure = el("figure", { class: "chart", "data-chart": chart.id, "data-series": chart.series.length,
                                  "data-kind": chart.kind || "lines" });
    box.appendChild(figure);
    try {
      if (!chart.series.some((s) => s.points.length)) {
        figure.appendChild(el("div", { class: "u-title" }, chart.title));
        figure.appendChild(el("div", { class: "empty" }, "nothing drawable"));
      } else {
        const columns = aligned(chart);
        const plot = new uPlot(options(chart, figure, figure.clientWidth || 480, columns[0].length - 1), columns,
                               figure);
        if (chart.kind !== "bars") plot.setLegend({ idx: columns[0].length - 1 }, false);
        drawn.push({ plot, figure });
      }
    } catch (error) {
      figure.appendChild(el("div", { class: "chart-error" }, `chart not drawn: ${error}`));
      document.documentElement.dataset.chartErrors = String(Number(document.documentElement.dataset.chartErrors
                                                                  || 0) + 1);
    }
    if (chart.left_out) {
      figure.appendChild(el("figcaption", { class: "left-out" },
                            `${chart.left_out} values not drawn (NaN, ±inf, text or |value| > 1e300)`));
    }
  }

  for (const group of data.charts) {
    const box = document.getElementById(group.id);
    if (box) group.charts.forEach((chart) => draw(box.querySelector(".charts"), chart));
  }
  let pending = null;
  window.addEventListener("resize", () => {
    clearTimeout(pending);
    pending = setTimeout(() => drawn.forEach(({ plot, figure }) => {
      plot.setSize({ width: figure.clientWidth || plot.width, height: HEIGHT });
    }), 100);
  });
  document.documentElement.dataset.charts = String(drawn.length);
})();
