"""Run by tests/app/serve/test_agent_clients.py in the clients' own venv (pydantic-ai and its
openai client, unmodified): a typed agent against `kvscope serve`. Prints one JSON line with
what came back; any failure is a traceback and a non-zero exit.

usage: python pydantic_ai_agent.py BASE_URL MODEL
"""

import json
import sys

from pydantic import BaseModel, Field
from pydantic_ai import Agent, UsageLimits
from pydantic_ai.exceptions import UsageLimitExceeded
from pydantic_ai.models.openai import OpenAIChatModel
from pydantic_ai.providers.openai import OpenAIProvider


class City(BaseModel):
    name: str = Field(max_length=30)
    country: str = Field(max_length=30)


class Forecast(BaseModel):
    city: str = Field(max_length=30)
    summary: str = Field(max_length=60)


def main(base_url: str, model_name: str) -> None:
    model = OpenAIChatModel(
        model_name, provider=OpenAIProvider(base_url=base_url, api_key="unused")
    )
    settings = {"temperature": 0.0, "max_tokens": 200, "seed": 1}
    limits = UsageLimits(request_limit=8)

    # Typed output alone: pydantic-ai offers one output tool and requires a call to it.
    typed = Agent(model, output_type=City, model_settings=settings)
    city = typed.run_sync("Name a city in France.", usage_limits=limits)

    # A tool beside the typed output: the agent calls it, sends its result back, and asks
    # again. A 135M model tends to call the tool again rather than answer, so the run may end
    # at the request limit; what must hold is that every reply parsed into calls pydantic-ai
    # could run (a reply it cannot read raises something else).
    calls: list[str] = []
    agent = Agent(model, output_type=Forecast, model_settings=settings)

    @agent.tool_plain
    def get_weather(city: str) -> str:
        """The current weather in a city."""
        calls.append(city)
        return f"Sunny and 21 C in {city}."

    try:
        forecast = agent.run_sync(
            "What is the weather in Paris?", usage_limits=UsageLimits(request_limit=3)
        )
        answer = forecast.output.model_dump()
    except UsageLimitExceeded:
        answer = None
    print(json.dumps({"city": city.output.model_dump(), "forecast": answer, "calls": calls}))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
