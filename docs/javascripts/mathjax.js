// MathJax 3 for both kinds of page: Markdown pages (pymdownx.arithmatex wraps math in
// .arithmatex as \( \) and \[ \]) and the tutorial notebooks (mkdocs-jupyter / nbconvert leave
// $ and $$ as they are, in plain elements).
window.MathJax = {
  tex: {
    inlineMath: [["\\(", "\\)"], ["$", "$"]],
    displayMath: [["\\[", "\\]"], ["$$", "$$"]],
    processEscapes: true,
    processEnvironments: true,
  },
  options: {
    ignoreHtmlClass: "tex2jax_ignore",
    processHtmlClass: "tex2jax_process|arithmatex|jp-RenderedMarkdown",
  },
};

document$.subscribe(() => {
  MathJax.startup.output.clearCache();
  MathJax.typesetClear();
  MathJax.texReset();
  MathJax.typesetPromise();
});
