"""Token-length distributions of a scenario (``prompt_tokens``, ``output_tokens``, a conversation's turns, a
session's steps): pydantic models, drawn by plan/arrivals.py ``sample_length``."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal, Union

from pydantic import BaseModel, ConfigDict, Field, model_validator

MAX_TOKENS = 1_048_576  # one prompt or output (the longest context windows served today)


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


# ---- length distributions ------------------------------------------------------------------------------
class Clipped(Strict):
    min: int = Field(1, ge=0, description="tokens: a sample below this is raised to it (default 1)")
    max: int | None = Field(None, ge=1, le=MAX_TOKENS, description="tokens: a sample above this is lowered to it "
                            "(default none: only the 1,048,576-token limit)")

    @model_validator(mode="after")
    def _order(self) -> "Clipped":
        if self.max is not None and self.max < self.min:
            raise ValueError(f"max ({self.max}) is below min ({self.min})")
        return self


class Fixed(Strict):
    dist: Literal["fixed"] = Field(description="fixed: every sample is the same length")
    value: int = Field(ge=1, le=MAX_TOKENS, description="tokens: the length of every sample")


class Uniform(Clipped):
    dist: Literal["uniform"] = Field(description="uniform: every whole length from min to max equally likely")
    min: int = Field(ge=1, le=MAX_TOKENS, description="tokens: the shortest length drawn (inclusive)")
    max: int = Field(ge=1, le=MAX_TOKENS, description="tokens: the longest length drawn (inclusive)")


class Normal(Clipped):
    dist: Literal["normal"] = Field(description="normal: a Gaussian length, rounded, then clipped to min/max")
    mean: float = Field(gt=0, le=MAX_TOKENS, description="tokens: the distribution's mean")
    std: float = Field(ge=0, le=MAX_TOKENS, description="tokens: its standard deviation (0: always the mean)")


class LogNormal(Clipped):
    dist: Literal["lognormal"] = Field(description="lognormal: median × e^(sigma × a standard normal draw)")
    median: float = Field(gt=0, le=MAX_TOKENS, description="tokens: the distribution's median")
    sigma: float = Field(ge=0, le=10, description="the standard deviation of the length's natural log "
                         "(0: always the median)")


class Exponential(Clipped):
    dist: Literal["exponential"] = Field(description="exponential: a long-tailed length, rounded and clipped")
    mean: float = Field(gt=0, le=MAX_TOKENS, description="tokens: the distribution's mean")


class Empirical(Clipped):
    """``histogram: [[lo, hi, weight], ...]`` (uniform inside a bin) or ``file:`` (one length per line)."""

    dist: Literal["empirical"] = Field(description="empirical: lengths from a histogram or a file")
    histogram: list[tuple[int, int, float]] | None = Field(None, description="bins [lo, hi, weight]: a bin drawn "
                                                           "by weight, then a length uniform in lo..hi")
    file: Path | None = Field(None, description="a file of lengths, one a line (the first comma-separated field), "
                              "each equally likely; relative to the scenario file")

    @model_validator(mode="after")
    def _one_source(self) -> "Empirical":
        if (self.histogram is None) == (self.file is None):
            raise ValueError("give exactly one of histogram or file")
        for lo, hi, weight in self.histogram or []:
            if lo < 1 or hi < lo or hi > MAX_TOKENS or weight < 0:
                raise ValueError(f"bad histogram bin [{lo}, {hi}, {weight}]: need 1 <= lo <= hi <= {MAX_TOKENS}, "
                                 "weight >= 0")
        return self


class Component(Strict):
    weight: float = Field(gt=0, description="this component's relative share of samples (any positive number)")
    dist: "Distribution" = Field(description="the length distribution this component draws from")


class Mixture(Clipped):
    dist: Literal["mixture"] = Field(description="mixture: each sample drawn from one component picked by weight")
    components: list[Component] = Field(min_length=1, description="the distributions mixed, with their weights")


Distribution = Annotated[Union[Fixed, Uniform, Normal, LogNormal, Exponential, Empirical, Mixture],
                         Field(discriminator="dist")]
Component.model_rebuild()
