// The admin page's one script.
//
// A logged-in session is the cookie and a key (see the server's `admin/ui/mod.rs`): the key
// lives in this origin's localStorage, which no server on another port can read, and goes with
// every request as `x-sluice-key`. Pages of a logged-in viewer (`body[data-keyed]`) are
// therefore fetched, not navigated to: links and forms are fetched with the key and the new
// page's body replaces this one. A navigation gets a page with no data (`data-loader`) that
// fetches the real one; the login answer (`data-key`) hands the key over once.
(function () {
  var KEY = 'sluice-key';

  function storedKey() {
    try { return window.localStorage.getItem(KEY); } catch (e) { return null; }
  }
  function forget() {
    try { window.localStorage.removeItem(KEY); } catch (e) { /* nothing kept */ }
  }
  function keyed() { return document.body.hasAttribute('data-keyed'); }

  // Put the page `text` (fetched from `url`) in place of this one.
  function show(text, url, history_how) {
    var doc = new DOMParser().parseFromString(text, 'text/html');
    // What the last action came to stays on the page through refreshes.
    var flash = document.querySelector('.flash');
    var place = doc.querySelector('main h1');
    if (history_how === 'refresh' && flash && !doc.querySelector('.flash') && place) {
      place.after(doc.adoptNode(flash.cloneNode(true)));
    }
    document.title = doc.title;
    document.body.replaceWith(document.adoptNode(doc.body));
    if (history_how === 'push') { window.history.pushState(null, '', url); }
    if (history_how === 'replace') { window.history.replaceState(null, '', url); }
    // A refresh keeps the reader where they were; a new page starts at its top.
    if (history_how !== 'refresh') { window.scrollTo(0, 0); }
    start(true);
  }

  function load(url, init, history_how) {
    var key = storedKey();
    if (!key) { window.location.replace('/ui/login'); return; }
    init = init || {};
    init.headers = { 'x-sluice-key': key };
    init.credentials = 'same-origin';
    window.fetch(url, init).then(function (response) {
      if (response.headers.get('x-sluice-login')) {
        forget();
        window.location.replace('/ui/login');
        return null;
      }
      return response.text().then(function (text) { show(text, response.url, history_how); });
    }).catch(function (err) {
      var main = document.querySelector('main');
      if (main) { main.textContent = 'The admin server did not answer: ' + err; }
    });
  }

  // Countdowns to due times: the server's clock at render time, advanced by this page's clock.
  var loaded = Date.now();
  function tick() {
    document.querySelectorAll('[data-due]').forEach(function (el) {
      var left = Number(el.dataset.due) - (Number(el.dataset.now) + (Date.now() - loaded));
      if (left <= 0) { el.textContent = 'due now'; return; }
      var s = Math.floor(left / 1000), h = Math.floor(s / 3600), m = Math.floor(s % 3600 / 60);
      el.textContent = 'in ' + (h ? h + 'h ' : '') + (h || m ? m + 'm ' : '') + (s % 60) + 's';
    });
  }

  // What the page in place asks for; `fetched`: it came from `load`, with the key.
  function start(fetched) {
    loaded = Date.now();
    tick();
    var body = document.body;
    if (body.querySelector('[data-login]')) {
      // Fetched with the key and still the login form: the session is over. Reached by a
      // navigation, though, it may only mean the browser left the cookie out (a link from
      // another site: SameSite=Strict); a fetch from here sends it, so try the key first.
      if (fetched) { forget(); } else if (storedKey()) { load('/ui/', {}, 'replace'); }
      return;
    }
    if (body.hasAttribute('data-key')) {
      try { window.localStorage.setItem(KEY, body.getAttribute('data-key')); } catch (e) { /* shown below */ }
      body.removeAttribute('data-key');
      load('/ui/', {}, 'replace');
      return;
    }
    if (body.hasAttribute('data-loader')) { load(window.location.href, {}, 'replace'); }
  }

  document.addEventListener('click', function (e) {
    if (!keyed() || e.defaultPrevented || e.button !== 0 || e.ctrlKey || e.metaKey || e.shiftKey || e.altKey) { return; }
    var a = e.target.closest('a[href]');
    if (!a || a.origin !== window.location.origin || a.pathname.indexOf('/ui') !== 0) { return; }
    e.preventDefault();
    load(a.href, {}, 'push');
  });

  document.addEventListener('submit', function (e) {
    var form = e.target;
    // Ask before the actions that cannot be undone.
    // A bulk form acts on the boxes ticked for it: none ticked, nothing to ask or send.
    var picked = form.id ? document.querySelectorAll('input[form="' + form.id + '"]:checked').length : 0;
    if (form.dataset.needs && picked === 0) { e.preventDefault(); window.alert('Tick the entries to act on first.'); return; }
    var ask = form.dataset.confirm && form.dataset.confirm.replace('{n}', String(picked));
    if (ask && !window.confirm(ask)) { e.preventDefault(); return; }
    if (!keyed()) { return; }
    e.preventDefault();
    if (form.hasAttribute('data-upload')) {
      // A component goes as the body; the other fields (CSRF token included) in the query.
      var input = form.querySelector('input[type="file"]');
      var file = input && input.files && input.files[0];
      if (!file) { window.alert('Choose a component (.wasm) first.'); return; }
      var params = new URLSearchParams();
      new FormData(form).forEach(function (value, name) {
        if (typeof value === 'string') { params.append(name, value); }
      });
      var to = new URL(form.getAttribute('action') || '', window.location.href);
      to.search = params.toString();
      load(to.href, { method: 'POST', body: file }, 'push');
      return;
    }
    var data = new URLSearchParams(new FormData(form));
    // Attributes, not properties: a field named "action" hides `form.action`.
    var target = new URL(form.getAttribute('action') || '', window.location.href);
    if ((form.getAttribute('method') || 'get').toLowerCase() === 'post') {
      load(target.href, { method: 'POST', body: data }, 'push');
    } else {
      var url = target;
      url.search = data.toString();
      load(url.href, {}, 'push');
    }
  });

  window.addEventListener('popstate', function () {
    if (keyed()) { load(window.location.href, {}, 'none'); }
  });

  // The page refreshes itself every few seconds, unless the operator is in the middle of
  // something: a field focused or filled in, a box ticked, a fold opened, text selected. A
  // refresh never submits anything and never loses what they typed.
  function busy() {
    var active = document.activeElement;
    if (active && /^(INPUT|TEXTAREA|SELECT|BUTTON)$/.test(active.tagName)) { return true; }
    var changed = Array.prototype.some.call(document.querySelectorAll('input, textarea, select'), function (el) {
      if (el.type === 'hidden' || el.type === 'submit') { return false; }
      if (el.type === 'checkbox' || el.type === 'radio') { return el.checked !== el.defaultChecked; }
      if (el.tagName === 'SELECT') { return Array.prototype.some.call(el.options, function (o) { return o.selected !== o.defaultSelected; }); }
      return el.value !== el.defaultValue;
    });
    var selection = window.getSelection && String(window.getSelection());
    return changed || document.querySelector('details[open]') !== null || Boolean(selection);
  }
  function refresh() {
    if (!keyed() || document.hidden || busy()) { return; }
    load(window.location.href, {}, 'refresh');
  }
  setInterval(refresh, 5000);
  setInterval(tick, 1000);
  start(false);
})();
