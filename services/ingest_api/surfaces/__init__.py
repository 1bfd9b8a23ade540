"""The three API surfaces, each an aiohttp sub-application with its own error object."""
