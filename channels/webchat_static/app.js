// Parley WebChat: history over HTTP, live messages over a WebSocket; markdown-it (vendored in
// vendor/, MIT) parses markdown, nothing is fetched from elsewhere.
// Safety rule: text from a user or the model only ever reaches the page through textContent or
// createTextNode; never innerHTML.
"use strict";

(() => {
  // --- markdown: markdown-it (vendor/, MIT) parses, this builds the DOM -------------------
  // markdown-it parses CommonMark with GFM tables and strikethrough; raw HTML is off (shown as
  // text) and bare URLs are linked. Its HTML output is never used: render() walks the token
  // stream and builds elements from a fixed list of tags with createElement/createTextNode, so
  // nothing in a message can become markup, and every link goes through safeUrl (http/https
  // only). render(text) is pure: call it again on text that grew (streaming) and swap nodes.

  const TAGS = new Set(["p", "h1", "h2", "h3", "h4", "h5", "h6", "blockquote", "ul", "ol",
    "li", "table", "thead", "tbody", "tr", "th", "td", "strong", "em", "s", "code", "pre",
    "hr", "br"]);

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

  const markdown = window.markdownit ?
    window.markdownit("default", { html: false, linkify: true, breaks: true, typographer: false }) :
    null;

  function openNode(token) {
    if (token.type === "link_open") {
      const href = safeUrl(token.attrGet("href") || "");
      return href ? link(href) : el("span");
    }
    const node = el(TAGS.has(token.tag) ? token.tag : "span");
    if (token.tag === "ol") {
      const start = parseInt(token.attrGet("start") || "1", 10);
      if (start !== 1 && Number.isFinite(start)) node.start = start;
    }
    const align = /text-align:(left|center|right)/.exec(token.attrGet("style") || "");
    if (align) node.className = `align-${align[1]}`;
    return node;
  }

  function leaf(token, parent) {
    switch (token.type) {
      case "text":
        parent.appendChild(document.createTextNode(token.content));
        break;
      case "code_inline": {
        const code = el("code");
        code.textContent = token.content;
        parent.appendChild(code);
        break;
      }
      case "softbreak":
      case "hardbreak":
        parent.appendChild(el("br"));
        break;
      case "fence":
      case "code_block": {
        const pre = el("pre");
        const code = el("code");
        const lang = (token.info || "").trim().split(/\s+/)[0];
        if (/^[\w+#.-]{1,30}$/.test(lang)) code.dataset.lang = lang;
        code.textContent = token.content.replace(/\n$/, "");
        pre.appendChild(code);
        parent.appendChild(pre);
        break;
      }
      case "hr":
        parent.appendChild(el("hr"));
        break;
      case "image": { // never loaded from elsewhere: a link to it, named by its alt text
        const href = safeUrl(token.attrGet("src") || "");
        const node = href ? link(href) : el("span");
        node.textContent = token.content || href || "";
        parent.appendChild(node);
        break;
      }
      default:
        if (token.content) parent.appendChild(document.createTextNode(token.content));
    }
  }

  function build(tokens, root) {
    const stack = [root];
    for (const token of tokens) {
      const parent = stack[stack.length - 1];
      if (token.type === "inline") {
        build(token.children || [], parent);
      } else if (token.hidden) { // the <p> of a tight list item: its text goes in the <li>
        continue;
      } else if (token.nesting === 1) {
        const node = openNode(token);
        parent.appendChild(node);
        stack.push(node);
      } else if (token.nesting === -1) {
        if (stack.length > 1) stack.pop();
      } else {
        leaf(token, parent);
      }
    }
  }

  function render(text) {
    const frag = document.createDocumentFragment();
    if (!markdown) { // the library failed to load: plain text, never markup
      const plain = el("div", "plain");
      plain.textContent = String(text);
      frag.appendChild(plain);
      return frag;
    }
    build(markdown.parse(String(text), {}), frag);
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
    authError: $("auth-error"), chats: $("chats"), chatList: $("chat-list"),
    chatsEmpty: $("chats-empty"), chatsToggle: $("chats-toggle"),
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
    profile: storage.get("profile"), // this browser: its conversations are listed together
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
  const ID = /^[A-Za-z0-9_-]{8,64}$/;
  if (!state.chatId || !ID.test(state.chatId)) {
    state.chatId = randomId();
    storage.set("chat_id", state.chatId);
  }
  if (!state.profile || !ID.test(state.profile)) {
    state.profile = randomId();
    storage.set("profile", state.profile);
  }
  state.outbox = loadOutbox();

  function loadOutbox() {
    try {
      return JSON.parse(storage.get(`outbox.${state.chatId}`) || "[]");
    } catch {
      return [];
    }
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
      if (state.ws !== ws) return; // a socket of the conversation we switched away from
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
  ui.newButton.addEventListener("click", () => switchChat(randomId()));
  ui.chatsToggle.addEventListener("click", () => showChats(ui.chats.hidden));
  ui.earlier.addEventListener("click", () => {
    loadEarlier().catch((err) => systemError(`Could not load earlier messages: ${err.message}`));
  });
  window.addEventListener("online", () => {
    if (!state.ws) connect();
  });

  // --- conversations: this browser's chats (webchat_chats), listed and reopened ------------

  async function postJSON(path, body) {
    const response = await fetch(new URL(path, location.href), {
      method: "POST", cache: "no-store", body: JSON.stringify(body),
      headers: { ...authHeaders(), "Content-Type": "application/json" } });
    if (response.status === 401) throw new AuthError("token");
    const data = await response.json();
    if (!response.ok) throw new Error(data.error || `HTTP ${response.status}`);
    return data;
  }

  function registerChat() {
    return withAuth(() => postJSON("/api/conversations",
      { profile: state.profile, chat_id: state.chatId }));
  }

  function formatWhen(iso) {
    const date = new Date(iso);
    return Number.isNaN(date.getTime()) ? "" : date.toLocaleString([], {
      month: "short", day: "numeric", hour: "2-digit", minute: "2-digit" });
  }

  function chatItem(chat) {
    const li = el("li");
    const button = el("button", "chat-item");
    button.type = "button";
    button.dataset.chatId = chat.chat_id;
    if (chat.chat_id === state.chatId) {
      button.classList.add("current");
      button.setAttribute("aria-current", "true");
    }
    const title = el("span", "chat-title");
    title.textContent = chat.title || "(an image)";
    const when = el("span", "chat-time");
    when.textContent = formatWhen(chat.updated_at);
    button.append(title, when);
    button.addEventListener("click", () => {
      showChats(false);
      switchChat(chat.chat_id);
    });
    li.appendChild(button);
    return li;
  }

  async function refreshChats() {
    const data = await withAuth(() => getJSON("/api/conversations", { profile: state.profile }));
    ui.chatList.replaceChildren(...data.conversations.map(chatItem));
    ui.chatsEmpty.hidden = data.conversations.length > 0;
  }

  function showChats(open) {
    ui.chats.hidden = !open;
    ui.chatsToggle.setAttribute("aria-expanded", String(open));
    if (open) {
      refreshChats().catch((err) => systemError(`Could not list the conversations: ${err.message}`));
    }
  }

  // Another conversation on screen: its history, its unsent messages, its own socket.
  async function switchChat(chatId) {
    if (chatId === state.chatId) return;
    const old = state.ws;
    state.ws = null;
    state.ready = false;
    state.retries = 0;
    clearTimeout(state.timer);
    if (old) old.close();
    state.chatId = chatId;
    storage.set("chat_id", chatId);
    state.outbox = loadOutbox();
    state.bySeq = new Map();
    state.byMessageId = new Map();
    state.lastSeq = 0;
    state.firstSeq = null;
    for (const node of Array.from(ui.log.children)) if (node !== ui.earlier) node.remove();
    ui.earlier.hidden = true;
    setWorking(false);
    composerError("");
    try {
      await registerChat();
      await loadLatest();
    } catch (err) {
      systemError(`Could not open the conversation: ${err.message}`);
    }
    if (state.chatId !== chatId) return; // switched again meanwhile
    for (const frame of state.outbox) showPending(frame);
    connect();
    ui.text.focus();
  }

  // --- start ------------------------------------------------------------------------------

  async function boot() {
    for (let attempt = 0; ; attempt++) {
      try {
        state.info = await getJSON("/api/info");
        if (state.info.token_required && !state.token) await askToken("");
        await registerChat();
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
