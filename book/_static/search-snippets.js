/* Search result snippets from a page's article only (not the theme's header buttons, sidebars
 * or print-only table of contents), with TeX shown as readable text rather than its source.
 * Sphinx's searchtools.js builds each snippet with Search.htmlToText; this replaces it. */
(() => {
  'use strict';
  const SYMBOLS = {
    alpha: 'α', beta: 'β', gamma: 'γ', delta: 'δ', Delta: 'Δ', epsilon: 'ε', varepsilon: 'ε', eta: 'η',
    theta: 'θ', lambda: 'λ', mu: 'μ', pi: 'π', rho: 'ρ', sigma: 'σ', Sigma: 'Σ', tau: 'τ', phi: 'φ',
    varphi: 'φ', psi: 'ψ', omega: 'ω', Omega: 'Ω', times: '×', cdot: '·', cdots: '⋯', ldots: '…', dots: '…',
    le: '≤', leq: '≤', ge: '≥', geq: '≥', ne: '≠', neq: '≠', approx: '≈', sim: '∼', to: '→', rightarrow: '→',
    leftarrow: '←', mapsto: '↦', infty: '∞', sum: 'Σ', prod: 'Π', odot: '⊙', otimes: '⊗', oplus: '⊕',
    in: '∈', top: '⊤', intercal: '⊤', partial: '∂', nabla: '∇', sqrt: '√', pm: '±', propto: '∝', ell: 'ℓ',
    quad: ' ', qquad: ' ', ',': ' ', ';': ' ', '!': '', log: 'log', exp: 'exp', max: 'max', min: 'min',
    softmax: 'softmax', left: '', right: '', big: '', Big: '', bigl: '', bigr: '',
  };

  /** TeX source as plain text: delimiters dropped, commands as symbols, braces removed. */
  function texToText(tex) {
    return tex
      .replace(/^\s*(\\\(|\\\[|\$\$?)/, '').replace(/(\\\)|\\\]|\$\$?)\s*$/, '')
      .replace(/\\(?:mathrm|mathbf|mathit|mathcal|mathbb|boldsymbol|operatorname|text|textbf|textit)\s*\{([^{}]*)\}/g, '$1')
      .replace(/\\frac\s*\{([^{}]*)\}\s*\{([^{}]*)\}/g, '($1)/($2)')
      .replace(/\\([A-Za-z]+|[,;!])/g, (m, name) => (name in SYMBOLS ? SYMBOLS[name] : name))
      .replace(/[{}]/g, '')
      .replace(/\s+/g, ' ')
      .trim();
  }

  function htmlToText(htmlString, anchor) {
    const doc = new DOMParser().parseFromString(htmlString, 'text/html');
    const remove = ['.headerlink', 'script', 'style', '.bd-header-article', '#jb-print-docs-body',
                    '.bd-sidebar-secondary', '.prev-next-area', 'footer', '.pf-spec', '.copybtn',
                    '.toggle-details__summary', 'button'];
    remove.forEach(q => doc.querySelectorAll(q).forEach(el => el.remove()));
    doc.querySelectorAll('.math, mjx-container').forEach(el => {
      el.replaceWith(doc.createTextNode(texToText(el.textContent || '')));
    });
    const main = doc.querySelector('article.bd-article') || doc.querySelector('[role="main"]');
    if (!main) return '';
    if (anchor) {
      const part = main.querySelector(anchor);
      if (part) return part.textContent.replace(/\s+/g, ' ');
    }
    return main.textContent.replace(/\s+/g, ' ');
  }

  const patch = () => {
    // searchtools.js declares `Search` as a top-level const: a global binding, not window.Search
    if (typeof Search !== 'undefined') Search.htmlToText = htmlToText;  // eslint-disable-line no-undef
  };
  patch();
  document.addEventListener('DOMContentLoaded', patch);
  window.gpt2k3TexToText = texToText;
})();
