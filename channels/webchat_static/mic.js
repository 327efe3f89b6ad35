// Parley WebChat: the microphone button. Records a voice message with MediaRecorder and sends it
// through app.js's outbox and socket (window.parleySendAudio), like any message; the gateway saves
// it in the chat's inbox folder and transcribes it before the turn. Kept apart from app.js so the
// page's other parts change without touching it.
(() => {
  "use strict";

  const button = document.getElementById("mic");
  const TYPES = ["audio/webm;codecs=opus", "audio/ogg;codecs=opus", "audio/mp4", "audio/webm"];
  let recorder = null;
  let stream = null;
  let chunks = [];

  function supported() {
    return typeof window.MediaRecorder === "function" && Boolean(navigator.mediaDevices)
      && typeof navigator.mediaDevices.getUserMedia === "function";
  }

  function pickType() {
    if (typeof MediaRecorder.isTypeSupported !== "function") return "";
    return TYPES.find((type) => MediaRecorder.isTypeSupported(type)) || "";
  }

  function show(recording) {
    button.classList.toggle("recording", recording);
    button.setAttribute("aria-pressed", String(recording));
    button.textContent = recording ? "■ Stop" : "🎤";
    button.title = recording ? "Stop and send the recording" : "Record a voice message";
  }

  function fail(text) {
    if (window.parleyComposerError) window.parleyComposerError(text);
  }

  async function start() {
    try {
      stream = await navigator.mediaDevices.getUserMedia({ audio: true });
    } catch (err) {
      fail(`The microphone is not available: ${err.message || err.name}`);
      return;
    }
    const type = pickType();
    recorder = new MediaRecorder(stream, type ? { mimeType: type } : undefined);
    chunks = [];
    recorder.addEventListener("dataavailable", (event) => {
      if (event.data && event.data.size) chunks.push(event.data);
    });
    recorder.addEventListener("stop", () => { finish().catch((err) => fail(err.message)); });
    recorder.start();
    show(true);
  }

  async function finish() {
    const mime = (recorder && recorder.mimeType) || pickType() || "audio/webm";
    if (stream) stream.getTracks().forEach((track) => track.stop());
    recorder = null;
    stream = null;
    show(false);
    const blob = new Blob(chunks, { type: mime });
    chunks = [];
    if (blob.size) await window.parleySendAudio(blob);
  }

  // How a message's recording shows: a label and a player (app.js calls this).
  window.parleyAudioNode = (audio, localData, load) => {
    const box = document.createElement("div");
    box.className = "recording-note";
    box.textContent = "🎤 voice message";
    const player = document.createElement("audio");
    player.controls = true;
    player.preload = "none";
    if (localData) {
      player.src = localData;
    } else if (load) {
      load().then((r) => (r.ok ? r.blob() : Promise.reject(new Error(String(r.status)))))
        .then((blob) => { player.src = URL.createObjectURL(blob); })
        .catch(() => { box.append(" (could not be loaded)"); });
    }
    box.appendChild(player);
    return box;
  };

  if (!button) return;
  button.hidden = !supported();
  show(false);
  button.addEventListener("click", () => {
    if (recorder) recorder.stop();
    else start();
  });
})();
