// Parley WebChat: history over HTTP, live messages over a WebSocket, no dependencies.
// Safety rule: text from a user or the model only ever reaches the page through textContent or
// createTextNode; never innerHTML.
"use strict";

(() => {
  // --- a small, safe markdown renderer -----------------------------------------------------

  const FENCE = /^ {0,3}(`{3,}|~{3,})\s*([\w+#.-]*)\s*$/;
  const LIST = /^( *)([-*+]|\d{1,9}[.)])[ \t]+(.*)$/;
  const MAX_DEPTH = 6;

  function el(tag, className) {
    const node = document.createElement(tag);
    if (className) node.className = className;
    return node;
  }

  function safeUrl(href) {
    let url;
    try {
      url = new URL(href);
    } catch {
      return null;
    }
    return url.protocol === "http:" || url.protocol === "https:" ? url.href : null;
  }

  function link(href) {
    const a = el("a");
    a.href = href;
    a.rel = "noopener noreferrer nofollow";
    a.target = "_blank";
    return a;
  }

  const isWord = (ch) => ch !== undefined && /[\p{L}\p{N}]/u.test(ch);
  const isSpace = (ch) => ch === undefined || /\s/.test(ch);

  // Inline markup: `code`, **bold**, __bold__, *italic*, _italic_, [text](http…), bare http(s)
  // links and backslash escapes. Anything else, HTML included, stays text.
  function inline(text, parent, depth) {
    let buf = "";
    const noClose = new Set(); // delimiters with no closing match left: never search again
    const flush = () => {
      if (buf) parent.appendChild(document.createTextNode(buf));
      buf = "";
    };
    const put = (node, inner) => {
      flush();
      if (inner !== undefined) {
        if (depth < MAX_DEPTH) inline(inner, node, depth + 1);
        else node.textContent = inner;
      }
      parent.appendChild(node);
    };
    let i = 0;
    while (i < text.length) {
      const c = text[i];
      if (c === "\\" && i + 1 < text.length && /[\\`*_[\]()#+\-.!~>|]/.test(text[i + 1])) {
        buf += text[i + 1];
        i += 2;
        continue;
      }
      if (c === "`") {
        let n = 1;
        while (text[i + n] === "`") n++;
        const ticks = "`".repeat(n);
        const end = noClose.has(ticks) ? -1 : text.indexOf(ticks, i + n);
        if (end > i + n - 1 && text[end + n] !== "`") {
          let inner = text.slice(i + n, end);
          if (/^ .* $/.test(inner) && inner.trim()) inner = inner.slice(1, -1);
          const code = el("code");
          code.textContent = inner;
          put(code);
          i = end + n;
          continue;
        }
        if (end < 0) noClose.add(ticks);
        buf += ticks;
        i += n;
        continue;
      }
      if ((c === "*" || c === "_") && text[i + 1] === c && !isSpace(text[i + 2]) &&
          !(c === "_" && isWord(text[i - 1]))) {
        const pair = c + c;
        let end = noClose.has(pair) ? -1 : text.indexOf(pair, i + 2);
        while (end > 0 && isSpace(text[end - 1])) end = text.indexOf(pair, end + 1);
        if (end > i + 2 && !(c === "_" && isWord(text[end + 2]))) {
          put(el("strong"), text.slice(i + 2, end));
          i = end + 2;
          continue;
        }
        if (end < 0) noClose.add(pair);
      }
      // Single-character emphasis never starts or ends inside a word: 2*3*4, snake_case.
      if ((c === "*" || c === "_") && text[i + 1] !== c && !isSpace(text[i + 1]) &&
          !isWord(text[i - 1])) {
        let end = noClose.has(c) ? -1 : i;
        for (;;) {
          if (end < 0) break;
          end = text.indexOf(c, end + 1);
          if (end < 0) break;
          const ok = !isSpace(text[end - 1]) && text[end + 1] !== c && text[end - 1] !== c &&
            !isWord(text[end + 1]);
          if (ok) break;
        }
        if (end > i + 1) {
          put(el("em"), text.slice(i + 1, end));
          i = end + 1;
          continue;
        }
        if (end < 0) noClose.add(c);
      }
      if (c === "[") {
        const m = /\[([^\]\n]{1,1000})\]\(\s*<?([^\s()<>]+)>?\s*\)/y;
        m.lastIndex = i;
        const found = m.exec(text);
        const href = found && safeUrl(found[2]);
        if (href) {
          put(link(href), found[1]);
          i = m.lastIndex;
          continue;
        }
      }
      if ((c === "h" || c === "H") && !isWord(text[i - 1])) {
        const m = /https?:\/\/[^\s<>"'`]+/iy;
        m.lastIndex = i;
        const found = m.exec(text);
        if (found) {
          let url = found[0].replace(/[.,;:!?*_]+$/, "");
          if (url.endsWith(")") && !url.includes("(")) url = url.slice(0, -1);
          const href = safeUrl(url);
          if (href) {
            const a = link(href);
            a.textContent = url;
            put(a);
            i += url.length;
            continue;
          }
        }
      }
      buf += c;
      i++;
    }
    flush();
  }

  function paragraph(lines, depth) {
    const p = el("p");
    lines.forEach((line, k) => {
      if (k) p.appendChild(el("br"));
      inline(line.trim(), p, depth);
    });
    return p;
  }

  function listItem(lines, depth) {
    const li = el("li");
    const content = render(lines.join("\n"), depth + 1);
    const only = content.childNodes.length === 1 ? content.firstChild : null;
    if (only && only.nodeName === "P") {
      while (only.firstChild) li.appendChild(only.firstChild); // a tight item: no <p>
    } else {
      li.appendChild(content);
    }
    return li;
  }

  function list(lines, start, depth) {
    const first = LIST.exec(lines[start]);
    const indent = first[1].length;
    const ordered = /\d/.test(first[2]);
    const node = el(ordered ? "ol" : "ul");
    if (ordered && parseInt(first[2], 10) !== 1) node.start = parseInt(first[2], 10);
    const sameList = (m) => m && m[1].length <= indent + 1 && /\d/.test(m[2]) === ordered;
    let item = null;
    let offset = 0;
    let i = start;
    const done = () => {
      if (item) node.appendChild(listItem(item, depth));
    };
    while (i < lines.length) {
      const line = lines[i];
      const m = LIST.exec(line);
      if (sameList(m)) {
        done();
        item = [m[3]];
        offset = m[1].length + m[2].length + 1;
        i++;
        continue;
      }
      const lead = line.length - line.trimStart().length;
      if (line.trim() && lead > indent) { // continuation or nested content of the item
        item.push(line.slice(Math.min(lead, offset)));
        i++;
        continue;
      }
      if (!line.trim()) { // a blank line ends the list unless the list goes on after it
        let j = i + 1;
        while (j < lines.length && !lines[j].trim()) j++;
        const next = lines[j];
        if (next !== undefined && (sameList(LIST.exec(next)) ||
            next.length - next.trimStart().length > indent)) {
          item.push("");
          i = j;
          continue;
        }
      }
      break;
    }
    done();
    return [node, i];
  }

  function render(src, depth = 0) {
    const frag = document.createDocumentFragment();
    const lines = String(src).replace(/\r\n?/g, "\n").split("\n");
    let i = 0;
    while (i < lines.length) {
      const line = lines[i];
      const fence = FENCE.exec(line);
      if (fence) {
        const marker = fence[1];
        const body = [];
        i++;
        while (i < lines.length && !(lines[i].trim().startsWith(marker) &&
               /^(`+|~+)$/.test(lines[i].trim()))) {
          body.push(lines[i]);
          i++;
        }
        i++;
        const pre = el("pre");
        const code = el("code");
        if (fence[2]) code.dataset.lang = fence[2];
        code.textContent = body.join("\n");
        pre.appendChild(code);
        frag.appendChild(pre);
        continue;
      }
      if (!line.trim()) {
        i++;
        continue;
      }
      if (LIST.test(line) && depth < MAX_DEPTH) {
        const [node, next] = list(lines, i, depth);
        frag.appendChild(node);
        i = next;
        continue;
      }
      const para = [];
      while (i < lines.length && lines[i].trim() && !FENCE.test(lines[i]) &&
             !(para.length && LIST.test(lines[i]) && depth < MAX_DEPTH)) {
        para.push(lines[i]);
        i++;
      }
      frag.appendChild(paragraph(para, depth));
    }
    return frag;
  }

  window.parleyMarkdown = render;

  // --- state ------------------------------------------------------------------------------

  const $ = (id) => document.getElementById(id);
  const ui = {
    log: $("log"), earlier: $("earlier"), conn: $("conn"), newButton: $("new"),
    working: $("working"), progress: $("progress"), composer: $("composer"), text: $("text"),
    send: $("send"), file: $("file"), error: $("composer-error"), attachment: $("attachment"),
    preview: $("attachment-preview"), attachmentName: $("attachment-name"),
    removeAttachment: $("attachment-remove"), auth: $("auth"), token: $("token"),
    authError: $("auth-error"),
  };
  const KEY = "parley.webchat.";
  const storage = {
    get(name) {
      try { return localStorage.getItem(KEY + name); } catch { return null; }
    },
    set(name, value) {
      try {
        if (value === null) localStorage.removeItem(KEY + name);
        else localStorage.setItem(KEY + name, value);
        return true;
      } catch {
        return false;
      }
    },
  };

  function randomId() {
    if (crypto.randomUUID) return crypto.randomUUID();
    const b = crypto.getRandomValues(new Uint8Array(16)); // randomUUID needs a secure context
    b[6] = (b[6] & 0x0f) | 0x40;
    b[8] = (b[8] & 0x3f) | 0x80;
    const h = Array.from(b, (x) => x.toString(16).padStart(2, "0")).join("");
    return `${h.slice(0, 8)}-${h.slice(8, 12)}-${h.slice(12, 16)}-${h.slice(16, 20)}-${h.slice(20)}`;
  }

  const state = {
    chatId: storage.get("chat_id"),
    token: storage.get("token"),
    info: null,
    lastSeq: 0,
    firstSeq: null,
    bySeq: new Map(),
    byMessageId: new Map(),
    outbox: [],
    ws: null,
    ready: false,
    retries: 0,
    timer: null,
    attachment: null,
    authWaiters: [],
  };
  if (!state.chatId || !/^[A-Za-z0-9_-]{8,64}$/.test(state.chatId)) {
    state.chatId = randomId();
    storage.set("chat_id", state.chatId);
  }
  try {
    state.outbox = JSON.parse(storage.get(`outbox.${state.chatId}`) || "[]");
  } catch {
    state.outbox = [];
  }

  function saveOutbox() {
    if (!storage.set(`outbox.${state.chatId}`, JSON.stringify(state.outbox))) {
      console.warn("parley: the unsent messages could not be saved in local storage");
    }
  }

  // --- rendering --------------------------------------------------------------------------

  const ROLE_LABEL = { user: "You", assistant: "Parley" };
  const KIND_LABEL = { notice: "Parley", error: "Error", command: "Command", cron: "Scheduled",
                       heartbeat: "Heartbeat" };

  function nearBottom() {
    const log = ui.log;
    return log.scrollHeight - log.scrollTop - log.clientHeight < 80;
  }

  function scrollDown(force) {
    if (force) ui.log.scrollTop = ui.log.scrollHeight;
  }

  function formatTime(iso) {
    const date = iso ? new Date(iso) : new Date();
    return Number.isNaN(date.getTime()) ? "" : date.toLocaleTimeString([], { hour: "2-digit", minute: "2-digit" });
  }

  function messageNode(m) {
    const node = el("article", `msg ${m.role} kind-${m.kind}`);
    const meta = el("div", "meta");
    meta.textContent = `${KIND_LABEL[m.kind] || ROLE_LABEL[m.role] || m.role} · ${formatTime(m.created_at)}`;
    if (m.created_at) meta.title = new Date(m.created_at).toLocaleString();
    node.appendChild(meta);
    const body = el("div", "body");
    if (m.role === "assistant" && m.kind !== "notice" && m.kind !== "error") {
      body.appendChild(render(m.text));
    } else {
      const plain = el("div", "plain");
      plain.textContent = m.text;
      body.appendChild(plain);
    }
    node.appendChild(body);
    if (m.image) node.appendChild(imageNode(m.image, m.local_image));
    if (m.audio && window.parleyAudioNode) { // mic.js
      const url = `/api/media/${encodeURIComponent(m.audio.name)}?chat_id=${encodeURIComponent(state.chatId)}`;
      node.appendChild(window.parleyAudioNode(m.audio, m.local_audio,
        () => fetch(url, { headers: authHeaders() })));
    }
    return node;
  }

  function imageNode(image, localData) {
    const img = el("img");
    img.alt = "Image sent with the message";
    if (localData) {
      img.src = localData;
    } else {
      const url = `/api/media/${encodeURIComponent(image.name)}?chat_id=${encodeURIComponent(state.chatId)}`;
      fetch(url, { headers: authHeaders() })
        .then((r) => (r.ok ? r.blob() : Promise.reject(new Error(String(r.status)))))
        .then((blob) => { img.src = URL.createObjectURL(blob); })
        .catch(() => { img.alt = "The image could not be loaded"; });
    }
    return img;
  }

  // Messages sit in seq order; messages still being sent (no seq yet) stay at the end.
  function place(node, seq) {
    const stick = nearBottom();
    node.dataset.seq = seq === null ? "" : String(seq);
    if (node.parentNode) node.remove();
    if (seq === null) {
      ui.log.appendChild(node);
    } else {
      let after = ui.earlier; // scan back from the end: new messages almost always go last
      for (let child = ui.log.lastElementChild; child && child !== ui.earlier;
        child = child.previousElementSibling) {
        if (child.dataset.seq !== "" && Number(child.dataset.seq) < seq) {
          after = child;
          break;
        }
      }
      ui.log.insertBefore(node, after.nextSibling);
    }
    scrollDown(stick);
  }

  function show(m) {
    if (state.bySeq.has(m.seq)) return;
    state.lastSeq = Math.max(state.lastSeq, m.seq);
    state.firstSeq = state.firstSeq === null ? m.seq : Math.min(state.firstSeq, m.seq);
    const mine = m.role === "user" && m.message_id && state.byMessageId.get(m.message_id);
    if (mine) { // a message we sent came back from the log: safe, unless still pending
      if (!m.pending) markSent(m.message_id, m.seq);
      return;
    }
    const node = messageNode(m);
    state.bySeq.set(m.seq, node);
    if (m.message_id && m.role === "user") {
      state.byMessageId.set(m.message_id, node);
      if (!m.pending) forgetOutbox(m.message_id); // the gateway has it
    }
    place(node, m.seq);
  }

  function status(node, text, failed) {
    let line = node.querySelector(".status");
    if (!text) {
      if (line) line.remove();
      return;
    }
    if (!line) {
      line = el("div", "status");
      node.appendChild(line);
    }
    line.textContent = text;
    line.classList.toggle("failed", Boolean(failed));
  }

  function showPending(frame) {
    if (state.byMessageId.has(frame.message_id)) return;
    const node = messageNode({
      role: "user", kind: frame.text.startsWith("/") ? "command" : "user", text: frame.text,
      image: frame.image ? { name: "" } : null,
      local_image: frame.image && `data:${frame.image.mime};base64,${frame.image.data_base64}`,
      audio: frame.audio ? { name: "" } : null,
      local_audio: frame.audio && `data:${frame.audio.mime};base64,${frame.audio.data_base64}`,
      created_at: null,
    });
    node.classList.add("pending");
    status(node, "sending…");
    state.byMessageId.set(frame.message_id, node);
    place(node, null);
    scrollDown(true);
  }

  function markSent(messageId, seq) {
    forgetOutbox(messageId);
    const node = state.byMessageId.get(messageId);
    if (!node) return;
    if (node.dataset.seq === "") {
      node.classList.remove("pending");
      status(node, "");
      state.bySeq.set(seq, node);
      place(node, seq);
    }
  }

  function forgetOutbox(messageId) {
    const before = state.outbox.length;
    state.outbox = state.outbox.filter((f) => f.message_id !== messageId);
    if (state.outbox.length !== before) saveOutbox();
  }

  function systemError(text) {
    const node = el("article", "msg assistant system-error");
    node.setAttribute("role", "alert");
    node.textContent = text;
    place(node, null);
  }

  function setWorking(busy, lines) {
    ui.working.hidden = !busy;
    ui.progress.replaceChildren();
    if (busy) (lines || []).forEach(addProgress);
  }

  function addProgress(text) {
    if (ui.working.hidden) return; // progress of a turn that already ended
    const li = el("li");
    li.textContent = text;
    ui.progress.appendChild(li);
    while (ui.progress.children.length > 8) ui.progress.firstChild.remove();
  }

  function setConn(text, ok) {
    ui.conn.textContent = text;
    ui.conn.classList.toggle("ok", ok === true);
    ui.conn.classList.toggle("down", ok === false);
  }

  function composerError(text) {
    ui.error.textContent = text || "";
    ui.error.hidden = !text;
  }

  // --- HTTP -------------------------------------------------------------------------------

  class AuthError extends Error {}

  function authHeaders() {
    return state.token ? { Authorization: `Bearer ${state.token}` } : {};
  }

  async function getJSON(path, params) {
    const url = new URL(path, location.href);
    for (const [k, v] of Object.entries(params || {})) url.searchParams.set(k, String(v));
    const response = await fetch(url, { headers: authHeaders(), cache: "no-store" });
    if (response.status === 401) throw new AuthError("token");
    const data = await response.json();
    if (!response.ok) throw new Error(data.error || `HTTP ${response.status}`);
    return data;
  }

  function askToken(message) {
    ui.auth.hidden = false;
    ui.authError.textContent = message || "";
    ui.token.value = "";
    ui.token.focus();
    setConn("waiting for the access token", false);
    return new Promise((resolve) => state.authWaiters.push(resolve));
  }

  ui.auth.addEventListener("submit", (event) => {
    event.preventDefault();
    state.token = ui.token.value.trim();
    storage.set("token", state.token);
    ui.auth.hidden = true;
    const waiters = state.authWaiters.splice(0);
    waiters.forEach((resolve) => resolve());
  });

  async function withAuth(call) {
    for (;;) {
      try {
        return await call();
      } catch (err) {
        if (!(err instanceof AuthError)) throw err;
        await askToken(state.token ? "That token was not accepted." : "");
      }
    }
  }

  async function loadLatest() {
    const data = await withAuth(() => getJSON("/api/history", { chat_id: state.chatId }));
    data.messages.forEach(show);
    ui.earlier.hidden = !data.more;
    setWorking(data.busy);
    scrollDown(true);
  }

  async function loadEarlier() {
    if (state.firstSeq === null) return;
    const height = ui.log.scrollHeight;
    const data = await withAuth(() => getJSON("/api/history", {
      chat_id: state.chatId, before: state.firstSeq }));
    data.messages.forEach(show);
    ui.earlier.hidden = !data.more;
    ui.log.scrollTop += ui.log.scrollHeight - height;
  }

  async function catchUp() {
    for (;;) {
      const data = await withAuth(() => getJSON("/api/history", {
        chat_id: state.chatId, after: state.lastSeq }));
      data.messages.forEach(show);
      if (!data.more) return;
    }
  }

  // --- WebSocket --------------------------------------------------------------------------

  function connect() {
    clearTimeout(state.timer);
    state.ready = false;
    const url = new URL("/ws", location.href);
    url.protocol = location.protocol === "https:" ? "wss:" : "ws:";
    url.searchParams.set("chat_id", state.chatId);
    const ws = new WebSocket(url);
    state.ws = ws;
    setConn(state.retries ? "reconnecting…" : "connecting…", false);
    ws.onopen = () => { // the token goes in the first frame, never in the URL
      if (state.token || (state.info && state.info.token_required)) {
        ws.send(JSON.stringify({ type: "auth", token: state.token || "" }));
      }
    };
    ws.onmessage = (event) => {
      let frame;
      try {
        frame = JSON.parse(event.data);
      } catch {
        return;
      }
      onFrame(ws, frame);
    };
    ws.onclose = (event) => {
      if (state.ws !== ws) return;
      state.ready = false;
      state.ws = null;
      if (event.code === 4401) {
        if (state.info) state.info.token_required = true;
        askToken("That token was not accepted.").then(connect);
        return;
      }
      reconnectLater();
    };
  }

  function reconnectLater() {
    const delay = Math.min(10000, 500 * 2 ** state.retries) * (0.75 + Math.random() / 2);
    state.retries = Math.min(state.retries + 1, 10);
    setConn(`disconnected — reconnecting in ${Math.ceil(delay / 1000)} s`, false);
    clearTimeout(state.timer);
    state.timer = setTimeout(connect, delay);
  }

  async function onReady(ws, frame) {
    try {
      await catchUp(); // everything logged while we were away, before anything is resent
    } catch (err) {
      console.warn("parley: history after reconnect failed", err);
      ws.close();
      return;
    }
    if (state.ws !== ws) return;
    state.ready = true;
    state.retries = 0;
    setConn("connected", true);
    setWorking(frame.busy, frame.progress);
    for (const queued of state.outbox) transmit(queued);
  }

  // Live replies (channels.webchat.streaming): a reply shown while it is written, one node
  // per stream, re-rendered from the whole text so far; the final message replaces it.
  const partials = new Map();

  function showPartial(frame) {
    let node = partials.get(frame.stream);
    if (!node) {
      node = messageNode({ role: "assistant", kind: "partial", text: "", created_at: null });
      node.setAttribute("aria-busy", "true");
      partials.set(frame.stream, node);
      place(node, null);
    }
    const stick = nearBottom();
    node.querySelector(".body").replaceChildren(render(frame.text));
    scrollDown(stick);
  }

  function dropPartials() { // (re)connected: what was missed comes back as whole messages
    partials.forEach((node) => node.remove());
    partials.clear();
  }

  function endPartial(stream) {
    const node = stream && partials.get(stream);
    if (!node) return;
    node.remove();
    partials.delete(stream);
  }

  function onFrame(ws, frame) {
    switch (frame.type) {
      case "partial":
        showPartial(frame);
        break;
      case "partial_end":
        endPartial(frame.stream);
        break;
      case "ready":
        dropPartials();
        onReady(ws, frame);
        break;
      case "message":
        endPartial(frame.stream);
        show(frame.message);
        break;
      case "ack":
        markSent(frame.message_id, frame.seq);
        break;
      case "typing":
        setWorking(frame.busy);
        break;
      case "progress":
        addProgress(frame.text);
        break;
      case "error":
        onError(frame);
        break;
      default:
        break;
    }
  }

  function onError(frame) {
    const node = frame.message_id && state.byMessageId.get(frame.message_id);
    if (!node) {
      if (!frame.retry) systemError(frame.error);
      return;
    }
    if (frame.retry) {
      status(node, "waiting for the gateway — it is sent again after reconnecting");
      return;
    }
    forgetOutbox(frame.message_id);
    node.classList.remove("pending");
    node.classList.add("kind-error");
    status(node, `Not sent: ${frame.error}`, true);
  }

  function transmit(frame) {
    if (state.ready && state.ws) state.ws.send(JSON.stringify(frame));
  }

  // --- composing --------------------------------------------------------------------------

  function limitText(bytes) {
    if (bytes >= 1024 * 1024) return `${(bytes / 1024 / 1024).toFixed(1).replace(/\.0$/, "")} MB`;
    return `${Math.round(bytes / 1024)} KB`;
  }

  function readDataUrl(file) {
    return new Promise((resolve, reject) => {
      const reader = new FileReader();
      reader.onload = () => resolve(String(reader.result));
      reader.onerror = () => reject(reader.error);
      reader.readAsDataURL(file);
    });
  }

  async function attach(file) {
    composerError("");
    const info = state.info || { max_image_bytes: 5 * 1024 * 1024,
                                 image_types: ["image/png", "image/jpeg", "image/gif", "image/webp"] };
    if (!info.image_types.includes(file.type)) {
      composerError("Only PNG, JPEG, GIF and WebP images can be sent.");
      return;
    }
    if (file.size > info.max_image_bytes) {
      composerError(`That image is ${limitText(file.size)}; the limit is ${limitText(info.max_image_bytes)}.`);
      return;
    }
    const dataUrl = await readDataUrl(file);
    state.attachment = { mime: file.type, name: file.name || "pasted image", dataUrl };
    ui.preview.src = dataUrl;
    ui.attachmentName.textContent = `${state.attachment.name} (${limitText(file.size)})`;
    ui.attachment.hidden = false;
  }

  function clearAttachment() {
    state.attachment = null;
    ui.attachment.hidden = true;
    ui.preview.removeAttribute("src");
    ui.file.value = "";
  }

  function submit(text, withImage, audio) {
    composerError("");
    const image = withImage ? state.attachment : null;
    if (!text.trim() && !image && !audio) return false;
    const frame = { type: "message", chat_id: state.chatId, message_id: randomId(), text };
    if (audio) frame.audio = audio; // a recording from mic.js
    if (image) {
      frame.image = { data_base64: image.dataUrl.slice(image.dataUrl.indexOf(",") + 1),
                      mime: image.mime, name: image.name };
    }
    const info = state.info;
    if (info && text.length > info.max_text_chars) {
      composerError(`The message is ${text.length.toLocaleString()} characters; the limit is ${info.max_text_chars.toLocaleString()}.`);
      return false;
    }
    if (info && new TextEncoder().encode(JSON.stringify(frame)).length > info.max_frame_bytes) {
      composerError("The message is too large to send.");
      return false;
    }
    state.outbox.push(frame);
    saveOutbox();
    showPending(frame);
    transmit(frame);
    if (image) clearAttachment();
    return true;
  }

  ui.composer.addEventListener("submit", (event) => {
    event.preventDefault();
    if (submit(ui.text.value, true)) {
      ui.text.value = "";
      autosize();
    }
    ui.text.focus();
  });
  ui.text.addEventListener("keydown", (event) => {
    if (event.key === "Enter" && !event.shiftKey && !event.isComposing) {
      event.preventDefault();
      ui.composer.requestSubmit();
    }
  });
  function autosize() {
    ui.text.style.height = "auto";
    ui.text.style.height = `${Math.min(ui.text.scrollHeight + 2, 200)}px`;
  }
  ui.text.addEventListener("input", autosize);
  ui.text.addEventListener("paste", (event) => {
    const items = event.clipboardData ? Array.from(event.clipboardData.items) : [];
    const item = items.find((it) => it.kind === "file" && it.type.startsWith("image/"));
    if (item) {
      event.preventDefault();
      attach(item.getAsFile());
    }
  });
  ui.file.addEventListener("change", () => {
    if (ui.file.files && ui.file.files[0]) attach(ui.file.files[0]);
  });
  ui.removeAttachment.addEventListener("click", clearAttachment);
  window.parleySendAudio = async (blob) => { // a recording from mic.js
    const url = await readDataUrl(blob);
    return submit("", false, { data_base64: url.slice(url.indexOf(",") + 1), mime: blob.type });
  };
  window.parleyComposerError = composerError;
  ui.newButton.addEventListener("click", () => submit("/new", false));
  ui.earlier.addEventListener("click", () => {
    loadEarlier().catch((err) => systemError(`Could not load earlier messages: ${err.message}`));
  });
  window.addEventListener("online", () => {
    if (!state.ws) connect();
  });

  // --- start ------------------------------------------------------------------------------

  async function boot() {
    for (let attempt = 0; ; attempt++) {
      try {
        state.info = await getJSON("/api/info");
        if (state.info.token_required && !state.token) await askToken("");
        await loadLatest();
        break;
      } catch (err) {
        const delay = Math.min(10000, 500 * 2 ** attempt);
        setConn(`cannot reach the gateway (${err.message}) — retrying in ${Math.ceil(delay / 1000)} s`, false);
        await new Promise((resolve) => setTimeout(resolve, delay));
      }
    }
    for (const frame of state.outbox) showPending(frame); // unsent when the page was closed
    connect();
  }

  boot();
})();
