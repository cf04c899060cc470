// Countdowns to due times: the server's clock at render time, advanced by this page's clock.
(function () {
  var loaded = Date.now();
  function tick() {
    document.querySelectorAll('[data-due]').forEach(function (el) {
      var left = Number(el.dataset.due) - (Number(el.dataset.now) + (Date.now() - loaded));
      if (left <= 0) { el.textContent = 'due now'; return; }
      var s = Math.floor(left / 1000), h = Math.floor(s / 3600), m = Math.floor(s % 3600 / 60);
      el.textContent = 'in ' + (h ? h + 'h ' : '') + (h || m ? m + 'm ' : '') + (s % 60) + 's';
    });
  }
  tick();
  setInterval(tick, 1000);
  // Ask before the actions that cannot be undone.
  document.querySelectorAll('form[data-confirm]').forEach(function (form) {
    form.addEventListener('submit', function (e) {
      if (!window.confirm(form.dataset.confirm)) { e.preventDefault(); }
    });
  });
})();
