"""The `:` command palette: every console action by name (none of the gate actions when read-only)."""

from __future__ import annotations

from textual.command import DiscoveryHit, Hit, Hits, Provider


class GateCommands(Provider):
    """Offers what `TokengateApp.palette_commands()` lists; the app decides (read-only offers no actions)."""

    def _commands(self):
        commands = getattr(self.app, "palette_commands", None)
        return commands() if commands is not None else []

    async def discover(self) -> Hits:
        for name, help_text, callback in self._commands():
            yield DiscoveryHit(name, callback, help=help_text)

    async def search(self, query: str) -> Hits:
        matcher = self.matcher(query)
        for name, help_text, callback in self._commands():
            score = matcher.match(name)
            if score > 0:
                yield Hit(score, matcher.highlight(name), callback, help=help_text)
