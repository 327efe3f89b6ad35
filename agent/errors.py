"""The agent's exceptions. Each carries what the user should be told in the chat.

AgentError
 └── ProviderError                 the model could not be asked or did not answer
      ├── ProviderNotConfigured    no API key / base for the model: says what to set
      ├── ProviderAuthError        the key was refused
      ├── ProviderBadRequest       the request was refused as malformed (or too long)
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
    pass


class ProviderUnavailable(ProviderError):
    def __init__(self, message: str, *, model: str | None = None, attempts: int = 1,
                 retry_after: float | None = None) -> None:
        super().__init__(message, model=model, attempts=attempts)
        self.retry_after = retry_after

    @property
    def user_message(self) -> str:  # type: ignore[override]
        return (f"The model did not answer after {self.attempts} tries ({self}). "
                "Your message is kept; please try again in a moment.")
