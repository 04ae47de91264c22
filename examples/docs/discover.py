"""Discover a NeMo Gym deployment from its head server.

python examples/docs/discover.py gym-head:11000
"""

import sys

from nemogym_sdk import ServerDirectory

directory = ServerDirectory.from_head(sys.argv[1], wait=120)  # host:port, e.g. gym-head:11000
print(directory.agents)  # {'target_chars_agent': 'http://10.0.0.5:14211'}
print(directory.resources_servers)  # {'target_chars': 'http://10.0.0.5:13002'}
print(directory.resources_server_of("target_chars_agent"))  # target_chars
directory.wait_until_ready(timeout=60)
