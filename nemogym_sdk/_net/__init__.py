"""The SDK's private network plumbing, in one place (as httpx keeps its transports).

- ``aio``: aiohttp posts with retries and the background event loop of the sync facades;
- ``balance``: which deployment plays a rollout when several run the same agent;
- ``http``: ``requests`` calls, the one edge where its exceptions become the SDK's;
- ``ready``: the one poller that waits until servers answer;
- ``session``: the shared aiohttp session and its owner.

Nothing here is public API: the client, the directory, the verifier, LoRA sync and the
process room use these modules; users import those.
"""
