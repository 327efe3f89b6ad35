"""The ``agent.media:`` section: what happens to the files people send before a turn
(``agent/media/``) and how long the inbox keeps them (``gateway/inbox_cleanup.py``).

- ``inbox``: received files live in ``inbox/<channel>/<chat>/`` inside the workspace; the oldest
  go after ``max_age`` or when all of them take more than ``max_total`` (never one a pending
  message still refers to);
- ``transcription``: voice and audio to text, through any OpenAI-compatible
  ``/audio/transcriptions`` endpoint (``api_base``) or a litellm provider (``model`` alone);
- ``vision``: whether the turn's model sees images, and the auxiliary model that describes
  them to a model that does not;
- ``documents``: PDF, DOCX, text and Markdown read into the message within a token budget;
- ``speech``: a voice note answered with a voice note through an OpenAI-compatible
  ``/audio/speech`` endpoint.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import ByteSize, Field

from gateway.kernel.config_fields import Duration, OptionalStr, Section


class InboxConfig(Section):
    max_age: Duration = 30 * 86400.0
    """Files older than this are removed; 0 keeps them however old."""
    max_total: Annotated[ByteSize, Field(ge=0)] = ByteSize(1024 ** 3)
    """The inbox's total size; beyond it the oldest files go first. 0: no cap."""
    sweep_every: Duration = Field(3600.0, gt=0)


class TranscriptionConfig(Section):
    model: OptionalStr = None
    """Unset: no transcription (the agent gets the audio's path). With ``api_base``: the name
    the endpoint knows (``whisper-1``, ``whisper-large-v3``); without: a litellm model
    (``groq/whisper-large-v3``, ``openai/whisper-1``)."""
    api_base: OptionalStr = None
    """An OpenAI-compatible server (``https://api.groq.com/openai/v1``, a local faster-whisper
    or whisper.cpp server): ``POST {api_base}/audio/transcriptions``."""
    api_key: OptionalStr = None
    language: OptionalStr = None
    """An ISO-639-1 hint (``en``, ``de``); unset: the server detects it."""
    prompt: OptionalStr = None
    timeout: Duration = Field(120.0, gt=0)
    echo: bool = False
    """Post the transcript back in the chat (``🎤 …``) before the answer."""


class VisionConfig(Section):
    main_sees_images: bool | Literal["auto"] = "auto"
    """Whether images go to the turn's model as images: ``auto`` asks litellm's model info
    (``supports_vision``), and a model it does not know is taken to see them."""
    model: OptionalStr = None
    """The auxiliary model that describes images for a text-only main model (a litellm name,
    or ``openai/<name>`` at ``api_base``); unset: a text-only model gets only the path."""
    api_base: OptionalStr = None
    api_key: OptionalStr = None
    prompt: str = ("Describe this image for someone who cannot see it: what it shows, any "
                   "text in it word for word, and anything notable. Be concise.")
    max_tokens: int = Field(500, gt=0)
    timeout: Duration = Field(60.0, gt=0)


class DocumentsConfig(Section):
    enabled: bool = True
    max_tokens: int = Field(3000, gt=0)
    """How much of a document goes into the message (about 4 characters a token); the rest
    stays in the file, which the agent reads with ``read_file``."""
    max_pages: int = Field(500, gt=0)
    """Pages of a PDF looked at; a longer one is cut there too."""
    max_unpacked_bytes: Annotated[ByteSize, Field(gt=0)] = ByteSize(50 * 1024 ** 2)
    """A DOCX whose XML unpacks to more than this is refused (a zip bomb)."""


class SpeechConfig(Section):
    model: OptionalStr = None
    """Unset: answers stay text. Set (``tts-1``, ``kokoro``): a voice note is answered with
    a voice note (the text is kept in the history and shown as its caption)."""
    api_base: OptionalStr = None
    """An OpenAI-compatible server: ``POST {api_base}/audio/speech``."""
    api_key: OptionalStr = None
    voice: str = "alloy"
    format: Literal["opus", "mp3", "wav"] = "opus"
    max_chars: int = Field(1500, gt=0)
    """Longer answers are sent as text only."""
    channels: list[str] = Field(default_factory=lambda: ["telegram", "discord"])
    """Where a voice note is answered with one (channels that play it as a voice message)."""
    timeout: Duration = Field(120.0, gt=0)


class MediaConfig(Section):
    inbox: InboxConfig = InboxConfig()
    transcription: TranscriptionConfig = TranscriptionConfig()
    vision: VisionConfig = VisionConfig()
    documents: DocumentsConfig = DocumentsConfig()
    speech: SpeechConfig = SpeechConfig()
