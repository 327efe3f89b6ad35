"""The agent's exceptions. Each carries what the user should be told in the chat.

AgentError
 └── ProviderError                 the model could not be asked or did not answer
      ├── ProviderNotConfigured    no API key / base for the model: says what to set
      ├── ProviderAuthError        the key was refused
      ├── ProviderBadRequest       the request was refused as malformed
      │    └── ProviderContextTooLarge   the request did not fit the model's window
      └── ProviderUnavailable      429 / 5xx / timeouts / connection errors, retries exhausted
"""

from __future__ import annotations


class AgentError(Exception):
    """Base of everything the agent raises on purpose."""

    user_message = "Something went wrong on my side. Your message is kept; please try again."


class ProviderError(AgentError):
    def __init__(self, message: str, *, model: str | None = None, attempts: int = 1) -> None:
        super().__init__(message)
        self.model = model
        self.attempts = attempts

    @property
    def user_message(self) -> str:  # type: ignore[override]
        return f"The model could not answer: {self}"


class ProviderNotConfigured(ProviderError):
    @property
    def user_message(self) -> str:  # type: ignore[override]
        return f"⚙️ Parley is running, but no model is configured yet. {self}"


class ProviderAuthError(ProviderError):
    @property
    def user_message(self) -> str:  # type: ignore[override]
        return (f"The model provider refused the API key for {self.model}. Check agent.api_key "
                f"in your config (or the provider's environment variable). Details: {self}")


class ProviderBadRequest(ProviderError):
    @property
    def user_message(self) -> str:  # type: ignore[override]
        return f"The model refused the request ({self}). Your message is kept."


class ProviderContextTooLarge(ProviderBadRequest):
    @property
    def user_message(self) -> str:  # type: ignore[override]
        return ("The conversation no longer fits the model's context window. Your message is "
                "kept; send /new to start a fresh conversation.")


class ProviderUnavailable(ProviderError):
    def __init__(self, message: str, *, model: str | None = None, attempts: int = 1,
                 retry_after: float | None = None, cause: str = "unreachable") -> None:
        super().__init__(message, model=model, attempts=attempts)
        self.retry_after = retry_after
        self.cause = cause
        """``rate_limited``, ``timeout``, ``server_error`` or ``unreachable``."""

    @property
    def user_message(self) -> str:  # type: ignore[override]
        what = {"rate_limited": "is rate limiting us", "timeout": "timed out",
                "server_error": "kept failing"}.get(self.cause, "could not be reached")
        return (f"The model {what} ({self}); it did not answer after {self.attempts} tries. "
                "Your message is kept; please try again in a moment.")
