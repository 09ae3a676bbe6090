/* The web book's figure frame: draws every plotly figure of a page so that it reads at any
 * width and in either theme.
 *
 * The page carries each figure as JSON (gpt2k3.book.sphinx.figure_html): a <figure class="pf">
 * holding the figure's title as its <figcaption>, an empty plot <div> and the spec.  Plotly's
 * own title, legend and slider are SVG of a fixed size; here they become HTML that wraps at
 * any width and follows the theme: the title is the caption (updated by each slider step), the
 * legend a row of buttons above the plot (click one to hide or show its traces), and each
 * slider an <input type="range"> (arrow keys, Home/End, PageUp/PageDown move it) that runs the
 * same steps plotly's slider would.  What stays in the SVG -- axes, tick labels, axis titles,
 * annotations and colour bars -- is laid out by two rules and one measured pass:
 *
 *   - below NARROW px of width (a phone) the panels of a multi-panel figure are stacked, one
 *     above the other at full width, each colour bar beside its own panel, with fewer ticks;
 *   - margins start small and grow to hold every label (plotly's automargin for tick labels,
 *     then a measured pass for anything still reaching past the figure's edge, for tick labels
 *     of one axis that run together, for one panel's labels reaching into another panel, and
 *     for a plot area squeezed below its height);
 *   - colours follow html[data-theme]: transparent backgrounds, text, grid and lines in the
 *     theme's colours, near-black (or near-white) trace colours lightened (or darkened), text
 *     (annotations, labels on traces) at 4.5:1 contrast or better, and in dark mode colour
 *     scales with their lightness mirrored (a heatmap's zero cells are the page, not white).
 *
 * Nothing here is specific to one figure: every figure, present and future, gets it.
 */
(() => {
  'use strict';

  const NARROW = 560;            // figure width (px) below which panels stack
  const PANEL = {wide: 300, narrow: 220};   // plot-area height of one row of panels
  const GAP = {wide: 0, narrow: 76};        // initial vertical gap between stacked panels
  const MAX_PASSES = 6;

  const THEMES = {
    light: {font: '#24292f', muted: '#57606a', grid: '#e4e7ec', zero: '#c9ced6', line: '#8c959f',
            hover: '#ffffff', dimBg: 'rgba(255,255,255,0.85)'},
    dark: {font: '#d0d7de', muted: '#9da7b3', grid: '#30363d', zero: '#4b535d', line: '#8c959f',
           hover: '#161b22', dimBg: 'rgba(22,27,34,0.85)'},
  };

  // ------------------------------------------------------------------ small helpers
  const clone = x => (x === undefined ? x : JSON.parse(JSON.stringify(x)));
  const themeName = () => (document.documentElement.dataset.theme === 'dark' ? 'dark' : 'light');

  /** Plotly's pseudo-HTML (<br>, <b>, <i>, <sup>, <sub>, <em>) as safe HTML; nothing else survives. */
  function safeHTML(s) {
    const esc = String(s == null ? '' : s).replace(/&/g, '&amp;').replace(/</g, '&lt;').replace(/>/g, '&gt;');
    return esc.replace(/&lt;(\/?)(b|i|em|sup|sub|br)\s*\/?&gt;/gi, (m, slash, tag) => `<${slash}${tag.toLowerCase()}>`);
  }
  const plainText = s => String(s == null ? '' : s).replace(/<br\s*\/?>/gi, ' ').replace(/<[^>]*>/g, '');

  /** obj at a plotly attribute path ('title.text', 'shapes[0].y0'), creating containers. */
  function setPath(obj, path, value) {
    const parts = path.replace(/\[(\d+)\]/g, '.$1').split('.');
    let o = obj;
    for (let i = 0; i < parts.length - 1; i++) {
      const k = parts[i];
      if (o[k] === undefined || o[k] === null || typeof o[k] !== 'object') o[k] = /^\d+$/.test(parts[i + 1]) ? [] : {};
      o = o[k];
    }
    const last = parts[parts.length - 1];
    if (value === null) delete o[last]; else o[last] = value;
  }

  /** What Plotly.relayout(args) does to a layout, applied to the logical layout. */
  function relayoutInto(layout, args) {
    for (const [k, v] of Object.entries(args || {})) {
      if (k === 'title' && typeof v === 'string') setPath(layout, 'title.text', v);
      else setPath(layout, k, clone(v));
    }
  }

  /** What Plotly.restyle(args, traces) does to the data. */
  function restyleInto(data, args, traces) {
    const idx = traces == null ? data.map((_, i) => i) : [].concat(traces);
    for (const [k, v] of Object.entries(args || {})) {
      idx.forEach((t, j) => {
        if (!data[t]) return;
        const value = Array.isArray(v) ? v[j % v.length] : v;
        setPath(data[t], k, value);
      });
    }
  }

  function parseColor(c) {
    if (typeof c !== 'string') return null;
    c = c.trim().toLowerCase();
    const named = {black: [0, 0, 0], white: [255, 255, 255], grey: [128, 128, 128], gray: [128, 128, 128]};
    if (named[c]) return [...named[c], 1];
    let m = c.match(/^#([0-9a-f]{3})$/);
    if (m) return [...m[1]].map(h => parseInt(h + h, 16)).concat([1]);
    m = c.match(/^#([0-9a-f]{6})([0-9a-f]{2})?$/);
    if (m) return [0, 2, 4].map(i => parseInt(m[1].slice(i, i + 2), 16)).concat([m[2] ? parseInt(m[2], 16) / 255 : 1]);
    m = c.match(/^rgba?\(([^)]*)\)$/);
    if (m) {
      const p = m[1].split(',').map(s => parseFloat(s));
      return [p[0], p[1], p[2], p.length > 3 ? p[3] : 1];
    }
    return null;
  }
  const luminance = ([r, g, b]) => (0.2126 * r + 0.7152 * g + 0.0722 * b) / 255;
  const rgba = ([r, g, b, a]) => `rgba(${Math.round(r)},${Math.round(g)},${Math.round(b)},${a})`;

  /** A colour legible on the theme's background: dark ones lightened in dark mode, light ones
   * darkened in light mode; everything else unchanged. */
  function adapt(c, theme, isBackground) {
    const p = parseColor(c);
    if (!p) return c;
    const lum = luminance(p);
    if (isBackground) {
      if (theme === 'dark' && lum > 0.75) return THEMES.dark.dimBg.replace(/[\d.]+\)$/, `${Math.min(p[3], 0.85)})`);
      return c;
    }
    if (theme === 'dark' && lum < 0.3) {
      const t = 0.72;  // mix toward white
      return rgba([p[0] + (255 - p[0]) * t, p[1] + (255 - p[1]) * t, p[2] + (255 - p[2]) * t, p[3]]);
    }
    if (theme === 'light' && lum > 0.92) return rgba([90, 96, 104, p[3]]);
    return c;
  }

  /** WCAG relative luminance and contrast ratio of two parsed colours. */
  const lin = v => { v /= 255; return v <= 0.03928 ? v / 12.92 : ((v + 0.055) / 1.055) ** 2.4; };
  const relLum = p => 0.2126 * lin(p[0]) + 0.7152 * lin(p[1]) + 0.0722 * lin(p[2]);
  const contrast = (a, b) => { const x = relLum(a), y = relLum(b); return (Math.max(x, y) + 0.05) / (Math.min(x, y) + 0.05); };
  const PAGE = {light: [255, 255, 255, 1], dark: [20, 24, 30, 1]};

  /** A text colour that reads on the theme's page at 4.5:1 or better (WCAG AA): `adapt`'s
   * colour, mixed toward the theme's text colour until it does.  A grey reference label
   * (#555) would otherwise sit at 2.5:1 on a dark page. */
  function legible(c, theme) {
    const a = adapt(c, theme);
    const p = parseColor(a);
    if (!p) return a;
    const bg = PAGE[theme], fg = parseColor(THEMES[theme].font);
    for (let t = 0; t <= 1.0001; t += 0.1) {
      const q = [0, 1, 2].map(i => p[i] + (fg[i] - p[i]) * t).concat([p[3]]);
      if (contrast(q, bg) >= 4.5) return t === 0 ? a : rgba(q);
    }
    return THEMES[theme].font;
  }

  function toHsl([r, g, b]) {
    r /= 255; g /= 255; b /= 255;
    const max = Math.max(r, g, b), min = Math.min(r, g, b), l = (max + min) / 2;
    if (max === min) return [0, 0, l];
    const d = max - min, s = l > 0.5 ? d / (2 - max - min) : d / (max + min);
    const h = max === r ? (g - b) / d + (g < b ? 6 : 0) : max === g ? (b - r) / d + 2 : (r - g) / d + 4;
    return [h / 6, s, l];
  }
  function fromHsl([h, s, l]) {
    if (s === 0) return [l * 255, l * 255, l * 255];
    const q = l < 0.5 ? l * (1 + s) : l + s - l * s, p = 2 * l - q;
    const f = t => { t = (t + 1) % 1; return t < 1 / 6 ? p + (q - p) * 6 * t : t < 1 / 2 ? q : t < 2 / 3 ? p + (q - p) * (2 / 3 - t) * 6 : p; };
    return [f(h + 1 / 3) * 255, f(h) * 255, f(h - 1 / 3) * 255];
  }

  /** A colour scale for the theme.  In dark mode each stop keeps its hue and saturation and
   * mirrors its lightness, so the scale's white end (a heatmap's zero cells) becomes the dark
   * page and its dark end turns light: values still read from faint to strong. */
  function themedScale(scale, theme) {
    if (theme !== 'dark' || !Array.isArray(scale)) return scale;
    const bgL = toHsl(PAGE.dark)[2];
    return scale.map(([v, c]) => {
      const p = parseColor(c);
      if (!p) return [v, c];
      const [h, s, l] = toHsl(p);
      return [v, rgba(fromHsl([h, s, bgL + (1 - l) * (0.9 - bgL)]).concat([p[3]]))];
    });
  }

  /** Whether axis `id` shows categories (its type, or plotly's guess from string data). */
  function isCategory(L, data, id) {
    const a = L[axisKey(id)] || {};
    if (a.type) return a.type === 'category' || a.type === 'multicategory';
    const letter = id[0];
    return data.some(t => (t[letter + 'axis'] || letter) === id && Array.isArray(t[letter]) &&
                          t[letter].some(v => typeof v === 'string' && v.trim() !== '' && isNaN(Number(v))));
  }

  /** `text` broken into `lines` lines of about equal length, at spaces. */
  function wrapText(text, lines) {
    const words = String(text).replace(/<br\s*\/?>/gi, ' ').split(' ');
    const target = words.join(' ').length / lines;
    const out = [];
    let line = '';
    for (const w of words) {
      if (line && (line + ' ' + w).length > target * 1.15 && out.length < lines - 1) { out.push(line); line = w; }
      else line = line ? line + ' ' + w : w;
    }
    out.push(line);
    return out.join('<br>');
  }

  const axisKeys = (L, letter) => Object.keys(L).filter(k => new RegExp(`^${letter}axis\\d*$`).test(k))
    .sort((a, b) => (parseInt(a.slice(5)) || 1) - (parseInt(b.slice(5)) || 1));
  const axisId = key => key[0] + key.slice(5);                 // 'xaxis2' -> 'x2'
  const axisKey = id => `${id[0]}axis${id.slice(1)}`;          // 'x2' -> 'xaxis2'

  // ------------------------------------------------------------------ panels
  /** The figure's panels: each distinct (x domain, y domain) rectangle with its axes. */
  function cellsOf(L) {
    const cells = [];
    const find = (xd, yd) => cells.find(c => c.xd[0] === xd[0] && c.xd[1] === xd[1] && c.yd[0] === yd[0] && c.yd[1] === yd[1]);
    const xs = axisKeys(L, 'x');
    if (!xs.length) xs.push('xaxis');
    for (const xk of xs) {
      const xa = L[xk] || {};
      if (xa.overlaying) continue;
      const xid = axisId(xk);
      const yid = xa.anchor && xa.anchor !== 'free' ? xa.anchor : 'y' + xid.slice(1);
      const ya = L[axisKey(yid)] || {};
      const xd = (xa.domain || [0, 1]).slice(), yd = (ya.domain || [0, 1]).slice();
      let cell = find(xd, yd);
      if (!cell) { cell = {xd, yd, xs: [], ys: []}; cells.push(cell); }
      cell.xs.push(xid);
      if (!cell.ys.includes(yid)) cell.ys.push(yid);
    }
    for (const yk of axisKeys(L, 'y')) {           // y axes drawn over another (twin axes)
      const ya = L[yk];
      if (ya && ya.overlaying) {
        const cell = cells.find(c => c.ys.includes(ya.overlaying));
        if (cell && !cell.ys.includes(axisId(yk))) cell.ys.push(axisId(yk));
      }
    }
    cells.sort((a, b) => (b.yd[1] - a.yd[1]) || (a.xd[0] - b.xd[0]));
    return cells;
  }

  const cellOfAxis = (cells, id) => cells.findIndex(c => c.xs.includes(id) || c.ys.includes(id));
  function cellOfPoint(cells, x, y) {
    let best = 0, bestD = Infinity;
    cells.forEach((c, i) => {
      const dx = x < c.xd[0] ? c.xd[0] - x : x > c.xd[1] ? x - c.xd[1] : 0;
      const dy = y < c.yd[0] ? c.yd[0] - y : y > c.yd[1] ? y - c.yd[1] : 0;
      const d = dx * dx + dy * dy;
      if (d < bestD - 1e-12) { best = i; bestD = d; }
    });
    return best;
  }

  /** Re-place the panels: `placed[i]` is panel i's new {xd, yd}; annotations, shapes and colour
   * bars in paper coordinates move with the panel they belong to. */
  function movePanels(L, data, cells, placed, colorbarBeside) {
    const mapX = (x, i) => placed[i].xd[0] + (x - cells[i].xd[0]) / ((cells[i].xd[1] - cells[i].xd[0]) || 1) * (placed[i].xd[1] - placed[i].xd[0]);
    const mapY = (y, i) => placed[i].yd[0] + (y - cells[i].yd[0]) / ((cells[i].yd[1] - cells[i].yd[0]) || 1) * (placed[i].yd[1] - placed[i].yd[0]);
    cells.forEach((c, i) => {
      c.xs.forEach(id => { L[axisKey(id)] = L[axisKey(id)] || {}; if (!L[axisKey(id)].overlaying) L[axisKey(id)].domain = placed[i].xd.slice(); });
      c.ys.forEach(id => { L[axisKey(id)] = L[axisKey(id)] || {}; if (!L[axisKey(id)].overlaying) L[axisKey(id)].domain = placed[i].yd.slice(); });
    });
    const move = (o, xs, ys) => {
      const xref = o.xref || 'x', yref = o.yref || 'y';
      const px = xref === 'paper', py = yref === 'paper';
      if (!px && !py) return null;
      let i;
      if (px && py) {
        const x = xs.map(k => o[k]).filter(v => typeof v === 'number'), y = ys.map(k => o[k]).filter(v => typeof v === 'number');
        i = cellOfPoint(cells, x.reduce((a, b) => a + b, 0) / (x.length || 1), y.reduce((a, b) => a + b, 0) / (y.length || 1));
      } else {
        i = cellOfAxis(cells, px ? yref.split(' ')[0] : xref.split(' ')[0]);
        if (i < 0) return null;
      }
      if (px) xs.forEach(k => { if (typeof o[k] === 'number') o[k] = mapX(o[k], i); });
      if (py) ys.forEach(k => { if (typeof o[k] === 'number') o[k] = mapY(o[k], i); });
      return i;
    };
    const owners = {annotations: [], colorbars: {}};
    (L.annotations || []).forEach((a, j) => { owners.annotations[j] = move(a, ['x'], ['y']); });
    (L.shapes || []).forEach(s => move(s, ['x0', 'x1'], ['y0', 'y1']));
    data.forEach((t, j) => {
      const cb = t.colorbar || (t.marker && t.marker.colorbar);
      if (!cb || t.showscale === false) return;
      const i = Math.max(0, cellOfAxis(cells, t.xaxis || 'x'));
      owners.colorbars[j] = i;
      if (colorbarBeside) {
        Object.assign(cb, {x: 1.0, xanchor: 'left', xpad: 6, y: (placed[i].yd[0] + placed[i].yd[1]) / 2,
                           yanchor: 'middle', len: placed[i].yd[1] - placed[i].yd[0], lenmode: 'fraction',
                           thickness: 10, orientation: 'v'});
      } else {
        // just right of its own panel (the next panel moves over if the two then touch)
        Object.assign(cb, {x: placed[i].xd[1] + 0.012, xanchor: 'left', xpad: 4});
      }
    });
    return owners;
  }

  // ------------------------------------------------------------------ the displayed layout
  /** The layout plotly draws: the logical layout (as authored, after the slider steps), with its
   * title, legend and sliders left to the HTML around it, margins and panels fitted to the
   * width, and the theme's colours. */
  function display(fig) {
    const L = clone(fig.layout);
    const data = fig.data.map(t => Object.assign({}, t));
    const narrow = fig.narrow, theme = THEMES[fig.theme], fit = fig.fit;
    const cells = cellsOf(L);
    const rows = [...new Set(cells.map(c => c.yd.join()))].length;
    const stack = narrow && cells.length > 1 && new Set(cells.map(c => c.xd.join())).size > 1;
    const nPanels = stack ? cells.length : rows;
    const P = (narrow ? PANEL.narrow : PANEL.wide) * (stack || rows > 1 ? 1 : 1.08);
    const G = stack ? fit.gap : 0;

    L.title = {text: ''};
    L.showlegend = false;
    (L.sliders || []).forEach(s => { s.visible = false; });
    (L.updatemenus || []).forEach(u => { u.visible = false; });
    L.width = fig.width;
    L.autosize = false;
    L.uirevision = 'pf';
    L.dragmode = narrow ? false : (L.dragmode || 'zoom');
    L.uniformtext = {minsize: 9, mode: 'hide'};   // a bar label that cannot be read is left out
    L.font = Object.assign({}, L.font, {size: narrow ? 11 : 12, color: theme.font});
    L.paper_bgcolor = 'rgba(0,0,0,0)';
    L.plot_bgcolor = 'rgba(0,0,0,0)';
    // the template outlines bars in white, which reads as a glow on a dark page: outline them
    // in the page's own colour instead
    if (L.template && L.template.data) {
      const page = getComputedStyle(document.documentElement).getPropertyValue('--pst-color-background').trim()
        || (fig.theme === 'dark' ? '#14181e' : '#ffffff');
      L.template = Object.assign({}, L.template, {data: Object.assign({}, L.template.data)});
      for (const [type, list] of Object.entries(L.template.data)) {
        if (!Array.isArray(list)) continue;
        L.template.data[type] = list.map(d => (d && d.marker && d.marker.line && d.marker.line.color
          ? Object.assign({}, d, {marker: Object.assign({}, d.marker, {line: Object.assign({}, d.marker.line, {color: page})})})
          : d));
      }
    }
    L.hoverlabel = Object.assign({}, L.hoverlabel, {bgcolor: theme.hover, font: {color: theme.font}});

    // panels: stacked on a phone; on a wide screen as authored, with any gap the fit widened
    let placed = cells.map(c => ({xd: c.xd.slice(), yd: c.yd.slice()}));
    let area;
    if (stack) {
      area = nPanels * P + (nPanels - 1) * G;
      placed = cells.map((c, k) => ({xd: [0, 1], yd: [1 - (k * (P + G) + P) / area, 1 - k * (P + G) / area]}));
    } else {
      area = rows * P + (rows > 1 ? fit.gap : 0);
      placed.forEach((p, i) => {
        const shift = fit.shift[i] || 0;
        p.xd[0] = Math.min(p.xd[0] + shift, p.xd[1] - 0.15);
      });
      if (rows > 1 && fit.gap) {            // widen the gaps between rows by fit.gap px in all
        const tops = [...new Set(cells.map(c => c.yd[1]))].sort((a, b) => b - a);
        placed.forEach((p, i) => {
          const r = tops.indexOf(cells[i].yd[1]);
          const squeeze = 1 - fit.gap / area;
          const off = r * (fit.gap / (rows - 1)) / area;
          p.yd = [1 - (1 - cells[i].yd[0]) * squeeze - off, 1 - (1 - cells[i].yd[1]) * squeeze - off];
        });
      }
    }
    const owners = movePanels(L, data, cells, placed, stack);
    fig.owners = owners;
    fig.cells = cells;
    fig.area = area;

    // axes: labels make room for themselves; fewer ticks on a phone; the theme's colours
    for (const k of [...axisKeys(L, 'x'), ...axisKeys(L, 'y')].concat(axisKeys(L, 'x').length ? [] : ['xaxis', 'yaxis'])) {
      const a = L[k] = L[k] || {};
      a.automargin = true;
      Object.assign(a, {gridcolor: theme.grid, zerolinecolor: theme.zero, linecolor: theme.line,
                        tickcolor: theme.line});
      a.title = typeof a.title === 'string' ? {text: a.title} : Object.assign({}, a.title);
      a.title.font = Object.assign({}, a.title.font, {color: theme.font});
      const id = axisId(k);
      if (fit.wrap[id] && a.title.text) a.title.text = wrapText(a.title.text, fit.wrap[id]);
      if (fit.nticks[id]) a.nticks = fit.nticks[id];
      else if (narrow && !a.tickvals && a.dtick === undefined && !a.nticks && !isCategory(L, data, id)) a.nticks = k[0] === 'x' ? 6 : 7;
      if (fit.tickangle[id] !== undefined) a.tickangle = fit.tickangle[id];
      // a log axis labels its minor ticks (2, 5) at 3/4 of its font: keep those readable
      if (a.type === 'log') a.tickfont = Object.assign({}, a.tickfont, {size: Math.max((a.tickfont || {}).size || 0, 12)});
    }
    (L.annotations || []).forEach(a => {
      a.font = Object.assign({}, a.font);
      a.font.color = a.font.color ? legible(a.font.color, fig.theme) : theme.font;
      if (narrow && a.font.size) a.font.size = Math.max(10, Math.round(a.font.size * 0.85));
      if (a.bgcolor) a.bgcolor = adapt(a.bgcolor, fig.theme, true);
      if (a.arrowcolor) a.arrowcolor = adapt(a.arrowcolor, fig.theme);
    });
    (L.shapes || []).forEach(s => {
      if (s.line && s.line.color) s.line = Object.assign({}, s.line, {color: adapt(s.line.color, fig.theme)});
    });
    data.forEach(t => {
      for (const part of ['line', 'marker', 'textfont', 'insidetextfont', 'outsidetextfont']) {
        const text = part.endsWith('textfont');
        if (t[part] && typeof t[part].color === 'string') {
          t[part] = Object.assign({}, t[part], {color: (text ? legible : adapt)(t[part].color, fig.theme)});
        }
      }
      if (Array.isArray(t.colorscale)) t.colorscale = themedScale(t.colorscale, fig.theme);
      if (t.marker && Array.isArray(t.marker.colorscale)) {
        t.marker = Object.assign({}, t.marker, {colorscale: themedScale(t.marker.colorscale, fig.theme)});
      }
      if (t.marker && t.marker.line && typeof t.marker.line.color === 'string') {
        t.marker = Object.assign({}, t.marker, {line: Object.assign({}, t.marker.line, {color: adapt(t.marker.line.color, fig.theme)})});
      }
      const cb = t.colorbar || (t.marker && t.marker.colorbar);
      if (cb) {
        cb.tickfont = Object.assign({}, cb.tickfont, {color: theme.font});
        cb.outlinecolor = theme.grid;
        if (cb.title !== undefined) {
          cb.title = typeof cb.title === 'string' ? {text: cb.title} : Object.assign({}, cb.title);
          cb.title.font = Object.assign({}, cb.title.font, {color: theme.font});
          cb.title.side = 'right';   // beside the bar, clear of its end labels
        }
      }
    });

    L.margin = Object.assign({t: 12, b: 44, l: 56, r: 16, pad: 0, autoexpand: true}, fit.margin);
    L.height = Math.round(L.margin.t + L.margin.b + area + fit.extraHeight);
    return {data, layout: L};
  }

  // ------------------------------------------------------------------ measuring
  function boxesOf(gd) {
    const els = [];
    const add = (e, kind, owner) => {
      const r = e.getBoundingClientRect();
      if (r.width < 0.5 || r.height < 0.5) return;
      if (e.tagName !== 'rect' && !(e.textContent || '').trim()) return;
      els.push({kind, owner, e, box: [r.left, r.top, r.right, r.bottom]});
    };
    gd.querySelectorAll('g.infolayer > g[class$="title"] > text').forEach(t => {
      const c = t.getAttribute('class') || '';
      if (c !== 'gtitle') add(t, 'axis-title', c.replace('title', ''));
    });
    gd.querySelectorAll('g.annotation').forEach((g, i) => {
      const t = g.querySelector('text.annotation-text');
      if (t) add(t, 'annotation', 'a' + (g.getAttribute('data-index') || i));
    });
    gd.querySelectorAll('g.colorbar').forEach((cb, i) => {
      cb.querySelectorAll('text, rect.cbfill').forEach(t => add(t, 'colorbar', 'cb' + i));
    });
    gd.querySelectorAll('g.xaxislayer-above > g, g.yaxislayer-above > g').forEach(g => {
      const m = (g.getAttribute('class') || '').match(/^([xy]\d*)tick$/);
      if (m) g.querySelectorAll('text').forEach(t => add(t, 'tick', m[1]));
    });
    // numbers printed on the data (a bar's label outside it): must stay inside the figure
    gd.querySelectorAll('g.trace text.bartext, g.trace g.textpoint text').forEach(t => add(t, 'value-label', ''));
    return els;
  }

  const overlapPx = (a, b) => [Math.min(a[2], b[2]) - Math.max(a[0], b[0]), Math.min(a[3], b[3]) - Math.max(a[1], b[1])];

  /** One measured pass: returns true when it changed the fit (the figure is drawn again). */
  function refit(fig) {
    const gd = fig.gd, fl = gd._fullLayout;
    const svg = gd.querySelector('svg.main-svg');
    if (!fl || !svg) return false;
    const s = svg.getBoundingClientRect();
    const els = boxesOf(gd);
    const fit = fig.fit;
    let changed = false;
    const grow = (side, px) => {
      px = Math.ceil(px + 4);
      const m = Object.assign({t: 12, b: 44, l: 56, r: 16}, fit.margin);
      if (px > 0 && m[side] + px <= 260) { m[side] += px; fit.margin = m; changed = true; }
    };
    // 0. an axis title longer than its axis: on two lines (or three); measured again after
    let wrapped = false;
    for (const el of els.filter(e => e.kind === 'axis-title')) {
      const ax = fl[axisKey(el.owner)];
      if (!ax || !ax._length) continue;
      const along = el.owner[0] === 'x' ? el.box[2] - el.box[0] : el.box[3] - el.box[1];
      const lines = fit.wrap[el.owner] || 1;
      if (along > ax._length + 2 && lines < 3) { fit.wrap[el.owner] = lines + 1; wrapped = true; }
    }

    if (wrapped) return true;

    // 1. anything past the figure's edge: a wider margin on that side
    const over = {l: 0, r: 0, t: 0, b: 0};
    for (const el of els) {
      over.l = Math.max(over.l, s.left - el.box[0]);
      over.r = Math.max(over.r, el.box[2] - s.right);
      over.t = Math.max(over.t, s.top - el.box[1]);
      over.b = Math.max(over.b, el.box[3] - s.bottom);
    }
    for (const side of ['l', 'r', 't', 'b']) if (over[side] > 0.5) grow(side, over[side]);

    // 2. tick labels of one axis that run together: fewer ticks, or slanted category labels
    const byAxis = {};
    els.filter(e => e.kind === 'tick').forEach(e => (byAxis[e.owner] = byAxis[e.owner] || []).push(e));
    for (const [id, ticks] of Object.entries(byAxis)) {
      let hit = false;
      for (let i = 0; i < ticks.length && !hit; i++) {
        for (let j = i + 1; j < ticks.length; j++) {
          const [w, h] = overlapPx(ticks[i].box, ticks[j].box);
          if (w > 0.5 && h > 0.5) { hit = true; break; }
        }
      }
      if (!hit) continue;
      const ax = fl[axisKey(id)] || {};
      if (ax.type === 'category' || ax.type === 'multicategory') {
        if (id[0] !== 'x' || fit.tickangle[id] !== undefined) continue;   // rows of names: plotly spaces them
        fit.tickangle[id] = -35;
      } else {
        const n = fit.nticks[id] || ticks.length;
        fit.nticks[id] = Math.max(2, Math.floor(n * 0.6));
      }
      changed = true;
    }

    // 3. one panel's labels in another panel (or on its labels): more room between them
    const cells = fig.cells;
    if (cells.length > 1) {
      const cellOf = el => {
        if (el.kind === 'tick' || el.kind === 'axis-title') return cellOfAxis(cells, el.owner);
        if (el.kind === 'colorbar') {
          const j = Object.keys(fig.owners.colorbars)[parseInt(el.owner.slice(2))];
          return j === undefined ? -1 : fig.owners.colorbars[j];
        }
        if (el.kind === 'annotation') {
          const k = fig.owners.annotations[parseInt(el.owner.slice(1))];
          return k == null ? -1 : k;
        }
        return -1;
      };
      const plots = cells.map(c => {
        const xa = fl[axisKey(c.xs[0])], ya = fl[axisKey(c.ys[0])];
        return xa && ya ? [s.left + xa._offset, s.top + ya._offset, s.left + xa._offset + xa._length, s.top + ya._offset + ya._length] : null;
      });
      const stacked = fig.stacked;
      let needV = 0;
      const needH = {};
      for (const a of els) {
        const ca = cellOf(a);
        if (ca < 0) continue;
        const targets = els.filter(b => { const cb = cellOf(b); return cb >= 0 && cb !== ca; }).map(b => [b.box, cellOf(b)])
          .concat(plots.map((p, i) => [p, i]).filter(([p, i]) => p && i !== ca));
        for (const [box, cb] of targets) {
          const [w, h] = overlapPx(a.box, box);
          if (w <= 0.5 || h <= 0.5) continue;
          if (stacked) needV = Math.max(needV, h);
          else {
            // side by side: the right-hand panel of the two moves right; same column: rows apart
            const right = cells[ca].xd[0] > cells[cb].xd[0] ? ca : cb;
            if (cells[ca].xd[0] !== cells[cb].xd[0]) needH[right] = Math.max(needH[right] || 0, w);
            else needV = Math.max(needV, h);
          }
        }
      }
      if (needV > 0.5 && fit.gap < 400) { fit.gap += Math.ceil(needV + 6); changed = true; }
      const plotW = fl._size.w || 1;
      for (const [i, w] of Object.entries(needH)) {
        if ((fit.shift[i] || 0) < 0.3) { fit.shift[i] = (fit.shift[i] || 0) + (w + 8) / plotW; changed = true; }
      }
    }

    // 4. a plot area squeezed by its margins: a taller figure
    const want = fig.area;
    if (fl._size && fl._size.h < want - 1 && fit.extraHeight < 600) {
      fit.extraHeight += Math.ceil(want - fl._size.h);
      changed = true;
    }
    return changed;
  }

  // ------------------------------------------------------------------ the HTML around the plot
  const DASH = {dash: '5,3', dot: '1.5,2.5', dashdot: '5,2,1.5,2', longdash: '8,3', longdashdot: '8,2,1.5,2'};

  function swatch(fd, theme) {
    const ns = 'http://www.w3.org/2000/svg';
    const svg = document.createElementNS(ns, 'svg');
    svg.setAttribute('width', '22'); svg.setAttribute('height', '12'); svg.setAttribute('aria-hidden', 'true');
    const pick = c => adapt(Array.isArray(c) ? c[0] : c, theme) || THEMES[theme].font;
    const mode = fd.mode || '';
    const el = (tag, attrs) => { const e = document.createElementNS(ns, tag); for (const k in attrs) e.setAttribute(k, attrs[k]); svg.appendChild(e); };
    if (fd.type === 'bar' || fd.type === 'histogram' || (fd.fill && fd.fill !== 'none')) {
      el('rect', {x: 3, y: 1, width: 16, height: 10, rx: 1.5,
                  fill: pick(fd.type === 'bar' || fd.type === 'histogram' ? (fd.marker || {}).color : fd.fillcolor || (fd.line || {}).color)});
    }
    if (fd.type === 'scatter' && mode.includes('lines')) {
      const line = fd.line || {};
      el('line', {x1: 1, y1: 6, x2: 21, y2: 6, stroke: pick(line.color), 'stroke-width': Math.min(line.width || 2, 3.5),
                  'stroke-dasharray': DASH[line.dash] || (typeof line.dash === 'string' && /\d/.test(line.dash) ? line.dash : '')});
    }
    if (fd.type === 'scatter' && mode.includes('markers')) {
      el('circle', {cx: 11, cy: 6, r: 3.5, fill: pick((fd.marker || {}).color)});
    }
    return svg;
  }

  function buildLegend(fig) {
    const box = fig.legendBox;
    box.textContent = '';
    const fd = fig.gd._fullData || [];
    if (fig.layout.showlegend === false) { box.hidden = true; return; }
    const entries = [];
    const seen = {};
    fd.forEach((t, i) => {
      if (!t.showlegend || t.type === 'heatmap') return;
      const group = t.legendgroup || `#${i}`;
      if (seen[group]) { seen[group].traces.push(i); return; }
      seen[group] = {t, traces: [i]};
      entries.push(seen[group]);
    });
    // legendgroup members that are not shown in the legend toggle with their group
    fd.forEach((t, i) => {
      if (t.legendgroup && seen[t.legendgroup] && !seen[t.legendgroup].traces.includes(i)) seen[t.legendgroup].traces.push(i);
    });
    if (!(fig.layout.showlegend === true || entries.length > 1)) { box.hidden = true; return; }
    box.hidden = false;
    for (const entry of entries) {
      const li = document.createElement('li');
      const b = document.createElement('button');
      b.type = 'button';
      b.className = 'pf-legend-item pf-text';
      b.dataset.pfKind = 'legend';
      const on = fig.data[entry.traces[0]].visible !== 'legendonly';
      b.setAttribute('aria-pressed', String(on));
      b.title = on ? 'Hide these traces' : 'Show these traces';
      b.appendChild(swatch(entry.t, fig.theme));
      const label = document.createElement('span');
      label.innerHTML = safeHTML(entry.t.name);
      b.appendChild(label);
      b.addEventListener('click', () => {
        const show = fig.data[entry.traces[0]].visible === 'legendonly';
        entry.traces.forEach(i => { fig.data[i].visible = show ? true : 'legendonly'; });
        render(fig);
      });
      li.appendChild(b);
      box.appendChild(li);
    }
  }

  function buildSliders(fig) {
    const holder = fig.sliderBox;
    holder.textContent = '';
    fig.inputs = [];
    (fig.layout.sliders || []).forEach((s, si) => {
      if (s.visible === false || !(s.steps || []).length) return;
      const n = s.steps.length;
      const wrap = document.createElement('div');
      wrap.className = 'pf-slider';
      const id = `${fig.gd.id}-slider-${si}`;
      const label = document.createElement('label');
      label.htmlFor = id;
      label.className = 'pf-slider-value pf-text';
      label.dataset.pfKind = 'slider-value';
      const cv = s.currentvalue || {};
      const prefix = document.createElement('span');
      prefix.innerHTML = safeHTML(cv.prefix || '');
      const value = document.createElement('output');
      value.htmlFor = id;
      const suffix = document.createElement('span');
      suffix.innerHTML = safeHTML(cv.suffix || '');
      label.append(prefix, value, suffix);
      const input = document.createElement('input');
      input.type = 'range';
      input.id = id;
      input.min = '0'; input.max = String(n - 1); input.step = '1';
      input.className = 'pf-range';
      const ticks = document.createElement('div');
      ticks.className = 'pf-slider-ends';
      ticks.setAttribute('aria-hidden', 'true');
      const first = document.createElement('span'), last = document.createElement('span');
      first.className = last.className = 'pf-text';
      first.dataset.pfKind = last.dataset.pfKind = 'slider-label';
      first.innerHTML = safeHTML(s.steps[0].label);
      last.innerHTML = safeHTML(s.steps[n - 1].label);
      ticks.append(first, last);
      const show = i => {
        value.innerHTML = safeHTML(s.steps[i].label);
        input.value = String(i);
        input.setAttribute('aria-valuetext', plainText(`${cv.prefix || ''}${s.steps[i].label}${cv.suffix || ''}`));
        input.style.setProperty('--pf-fill', `${n > 1 ? (100 * i) / (n - 1) : 0}%`);
      };
      show(s.active || 0);
      input.addEventListener('input', () => step(fig, si, parseInt(input.value, 10)));
      wrap.append(label, input, ticks);
      holder.appendChild(wrap);
      fig.inputs[si] = show;
    });
    holder.hidden = !fig.inputs.length;
  }

  function setCaption(fig) {
    const t = fig.layout.title;
    const text = t && typeof t === 'object' ? t.text : t;
    fig.caption.innerHTML = safeHTML(text || '');
    fig.caption.hidden = !text;
  }

  // ------------------------------------------------------------------ drawing
  function draw(fig) {
    const {data, layout} = display(fig);
    fig.stacked = fig.narrow && fig.cells.length > 1 && new Set(fig.cells.map(c => c.xd.join())).size > 1;
    const config = Object.assign({}, fig.config, {responsive: false, displaylogo: false,
                                                  displayModeBar: fig.narrow ? false : 'hover'});
    fig.draws = (fig.draws || 0) + 1;
    return window.Plotly.react(fig.gd, data, layout, config);
  }

  async function render(fig) {
    if (fig.busy) { fig.again = true; return fig.busy; }
    fig.busy = (async () => {
      do {
        fig.again = false;
        await draw(fig);
        for (let pass = 0; pass < MAX_PASSES && refit(fig); pass++) await draw(fig);
        buildLegend(fig);
      } while (fig.again);
      delete fig.gd.dataset.pfPending;
    })();
    try { await fig.busy; } finally { fig.busy = null; }
  }

  function step(fig, si, i) {
    const s = fig.layout.sliders[si];
    const st = s.steps[i];
    if (!st) return;
    const args = st.args || [];
    if (st.method === 'restyle') restyleInto(fig.data, args[0], args[1]);
    else if (st.method === 'relayout') relayoutInto(fig.layout, args[0]);
    else if (st.method === 'update') { restyleInto(fig.data, args[0], args[2]); relayoutInto(fig.layout, args[1]); }
    s.active = i;
    fig.datarevision = (fig.datarevision || 0) + 1;
    fig.layout.datarevision = fig.datarevision;
    setCaption(fig);
    if (fig.inputs[si]) fig.inputs[si](i);
    if (fig.queued) render(fig); else queue(fig);   // not drawn yet: drawn at this step
  }

  /** The figure as plotly.js takes it: arrays stored once put back where they occur, and a
   * shared template (window.pfTemplates, from _static/plotly-templates.js) in place of its name. */
  function resolve(spec) {
    const shared = spec.shared || [];
    const walk = x => {
      if (Array.isArray(x)) return x.map(walk);
      if (x && typeof x === 'object') {
        if (typeof x.$s === 'number' && Object.keys(x).length === 1) return shared[x.$s].slice();
        const o = {};
        for (const k in x) o[k] = walk(x[k]);
        return o;
      }
      return x;
    };
    const out = walk({data: spec.data, layout: spec.layout, config: spec.config});
    const t = out.layout && out.layout.template;
    if (t && t.$template) out.layout.template = clone((window.pfTemplates || {})[t.$template]) || {};
    return out;
  }

  function modeOf(fig) {
    const w = Math.floor(fig.gd.getBoundingClientRect().width) || 600;   // the plot's own box
    return {width: w, narrow: w < NARROW};
  }

  function init(root) {
    const specEl = root.querySelector('script.pf-spec');
    const gd = root.querySelector('.pf-plot');
    if (!specEl || !gd || root.dataset.pfReady) return null;
    root.dataset.pfReady = '1';
    const spec = resolve(JSON.parse(specEl.textContent));
    const fig = {root, gd, data: spec.data || [], layout: spec.layout || {}, config: spec.config || {},
                 caption: root.querySelector('.pf-title')};
    fig.legendBox = document.createElement('ul');
    fig.legendBox.className = 'pf-legend';
    fig.legendBox.setAttribute('aria-label', 'Legend');
    gd.before(fig.legendBox);
    fig.sliderBox = document.createElement('div');
    fig.sliderBox.className = 'pf-sliders';
    gd.after(fig.sliderBox);
    if (fig.caption) {
      fig.caption.id = fig.caption.id || `${gd.id}-title`;
      gd.setAttribute('role', 'figure');
      gd.setAttribute('aria-labelledby', fig.caption.id);
    }
    gd.dataset.pfPending = '1';
    const resetFit = () => { fig.fit = {margin: {}, nticks: {}, tickangle: {}, shift: {}, wrap: {}, gap: fig.narrow ? GAP.narrow : 0, extraHeight: 0}; };
    Object.assign(fig, modeOf(fig), {theme: themeName()});
    resetFit();
    fig.resetFit = resetFit;
    setCaption(fig);
    buildSliders(fig);
    return fig;
  }

  const figures = [];
  let chain = Promise.resolve();
  /** Draw `fig` once, after the figures queued before it (one at a time keeps the page responsive). */
  const queue = fig => {
    if (!fig.queued) {
      fig.queued = chain = chain.then(() => {
        const mode = modeOf(fig);
        const reset = mode.narrow !== fig.narrow;
        Object.assign(fig, mode);
        if (reset) fig.resetFit();
        return render(fig);
      });
    }
    return fig.queued;
  };

  function start() {
    if (!window.Plotly) return;
    document.querySelectorAll('figure.pf').forEach(root => { const f = init(root); if (f) figures.push(f); });
    // a figure is drawn when it comes near the screen: the page's text is ready first, and a
    // long chapter does not draw what the reader never scrolls to
    const near = new IntersectionObserver(entries => {
      for (const e of entries) {
        if (!e.isIntersecting) continue;
        near.unobserve(e.target);
        const fig = figures.find(f => f.root === e.target);
        if (fig) queue(fig);
      }
    }, {rootMargin: '900px 0px'});
    figures.forEach(fig => near.observe(fig.root));
    /** Draw every figure of the page now (what a test or a print needs); resolves when done. */
    window.pfRenderAll = () => {
      const t0 = performance.now();
      return Promise.all(figures.map(queue)).then(() => {
        window.pfDrawn = {figures: figures.length, ms: performance.now() - t0,
                          draws: figures.reduce((a, f) => a + (f.draws || 0), 0)};
        return window.pfDrawn;
      });
    };
    window.addEventListener('beforeprint', () => { window.pfRenderAll(); });
    // redraw when the reader switches theme
    new MutationObserver(() => {
      const t = themeName();
      figures.forEach(fig => {
        if (fig.theme === t) return;
        fig.theme = t;
        if (fig.queued) fig.queued.then(() => render(fig));
      });
    }).observe(document.documentElement, {attributes: true, attributeFilter: ['data-theme']});
    // and when the column changes width (a rotated phone, a resized window)
    const ro = new ResizeObserver(entries => {
      for (const e of entries) {
        const fig = figures.find(f => f.gd === e.target);
        if (!fig || !fig.queued) continue;
        if (Math.abs(modeOf(fig).width - fig.width) < 2) continue;
        clearTimeout(fig.resizeTimer);
        fig.resizeTimer = setTimeout(() => {
          Object.assign(fig, modeOf(fig));
          fig.resetFit();
          render(fig);
        }, 120);
      }
    });
    figures.forEach(fig => ro.observe(fig.gd));
  }

  if (document.readyState === 'loading') document.addEventListener('DOMContentLoaded', start);
  else start();
})();
