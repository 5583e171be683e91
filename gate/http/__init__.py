"""The client-facing HTTP side: server and routes, the proxy (one task owns a request's
life), intake and its JSON checks, the per-API adapters (apis/: Anthropic Messages, Responses), tenants, client guards, the plain-answer assembly, request ids,
and `ports`: the few things the request path needs, handed to it by the composition root.

May know: every layer below (core, data, config, journal, backend, fleet, observe). Never the
operator layer, the tools, nor the service that builds it.
"""
