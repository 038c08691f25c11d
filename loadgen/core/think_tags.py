"""Reasoning inline in the answer's text, between ``<think>`` and ``</think>``: what llama-server streams with
``--reasoning-format none`` ("leaves thoughts unparsed in message.content", tools/server/README.md), SGLang with
``separate_reasoning: false`` or no reasoning parser, vLLM without ``--reasoning-parser``, and TGI. Pure, stdlib.

``ThinkSplitter`` (one per stream) is fed each event's content in order and says which part of it is reasoning
and which is answer. It splits only a stream whose content starts with ``<think>``: any other stream passes
through untouched, so an answer that merely mentions the tag stays the answer (a stream whose first content is a
start of the tag, "<th", waits one event for the rest; DeepSeek-R1's template puts ``<think>`` in the prompt, so
its streams open inside the reasoning without the tag: those are not split). The tags
count as reasoning (they are tokens the model generated while thinking); the text after ``</think>`` is the
answer. A tag may be cut anywhere between events: the splitter holds back a tail that could be the start of the
tag it waits for until the next event says what it is (``flush`` hands back what is still held at the end).
"""

from __future__ import annotations

OPEN, CLOSE = "<think>", "</think>"


class ThinkSplitter:
    __slots__ = ("state", "_held")

    def __init__(self) -> None:
        self.state = "start"  # start (nothing seen) | think (inside the tags) | answer (after them) | off
        self._held = ""  # text held back: a possible start of the tag awaited

    def feed(self, text: str) -> tuple[str, str]:
        """(reasoning, answer) parts of the next piece of content, in the stream's order (reasoning first)."""
        if self.state == "off" or self.state == "answer":
            return "", text
        text, self._held = self._held + text, ""
        if self.state == "start":
            if text.startswith(OPEN):
                self.state = "think"
                reasoning, answer = self._inside(text[len(OPEN):])
                return OPEN + reasoning, answer
            if OPEN.startswith(text):  # "" or "<thi": not decided yet
                self._held = text
                return "", ""
            self.state = "off"
            return "", text
        return self._inside(text)

    def _inside(self, text: str) -> tuple[str, str]:
        """Text within the tags: reasoning up to and with ``</think>``, the answer after it."""
        end = text.find(CLOSE)
        if end >= 0:
            self.state = "answer"
            return text[:end + len(CLOSE)], text[end + len(CLOSE):]
        keep = _tag_start(text, CLOSE)
        self._held = text[len(text) - keep:]
        return text[:len(text) - keep], ""

    def flush(self) -> tuple[str, str]:
        """What is still held back when the stream ends: reasoning inside the tags, else answer."""
        held, self._held = self._held, ""
        return (held, "") if self.state == "think" else ("", held)


def _tag_start(text: str, tag: str) -> int:
    """The length of the longest end of ``text`` that is a proper start of ``tag`` (0: none)."""
    for n in range(min(len(tag) - 1, len(text)), 0, -1):
        if text.endswith(tag[:n]):
            return n
    return 0


def tag_excess(text: str) -> int:
    """How much a local token estimate of ``text`` overcounts its think tags: each is one token (a special token
    of the models that emit them: Qwen3, DeepSeek-R1), but weighs 3 (``<think>``) or 4 (``</think>``) locally."""
    return 2 * text.count(OPEN) + 3 * text.count(CLOSE) if "think>" in text else 0
