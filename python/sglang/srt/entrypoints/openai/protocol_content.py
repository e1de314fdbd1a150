"""The strict base model of the OpenAI-compatible request schema and the parts of a chat message's content list
(text, image_url, SGLang's video_url / audio_url, OpenAI's input_audio). protocol.py builds the requests from them."""

from __future__ import annotations

from typing import Annotated, Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Field


class OpenAIModel(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class TextContentPart(OpenAIModel):
    type: Literal["text"]
    text: str


class ImageURL(OpenAIModel):
    url: str
    detail: Optional[Literal["auto", "low", "high"]] = "auto"


class ImageContentPart(OpenAIModel):
    type: Literal["image_url"]
    image_url: ImageURL


class VideoURL(OpenAIModel):
    url: str


class VideoContentPart(OpenAIModel):
    """SGLang's extension: {"type": "video_url", "video_url": {"url": data URL / base64 / allowed local file}}."""

    type: Literal["video_url"]
    video_url: VideoURL


class AudioURL(OpenAIModel):
    url: str


class AudioURLContentPart(OpenAIModel):
    """SGLang's extension: {"type": "audio_url", "audio_url": {"url": data URL / base64 / allowed local file}}."""

    type: Literal["audio_url"]
    audio_url: AudioURL


class InputAudio(OpenAIModel):
    data: str  # base64 of the audio file
    format: str  # "wav", "mp3", "flac", ... (checked by the audio loader)


class InputAudioContentPart(OpenAIModel):
    """OpenAI's {"type": "input_audio", "input_audio": {"data": <base64>, "format": "wav"}}."""

    type: Literal["input_audio"]
    input_audio: InputAudio


ContentPart = Annotated[Union[TextContentPart, ImageContentPart, VideoContentPart, AudioURLContentPart,
                              InputAudioContentPart], Field(discriminator="type")]
