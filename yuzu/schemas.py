"""The one ``referencing`` registry every JSON Schema validation in the server uses: it retrieves nothing.

jsonschema (4.18+) still follows a ``$ref`` to an unknown ``http(s)://`` URI by fetching it (deprecated, with no
timeout) unless the validator is given a registry of its own. Agents declare schemas (their plugin catalogue),
so a fetch would be a server-side request to any address an agent names, its answer leaking back in error
messages. With this registry a ``$ref`` resolves only inside the schema itself or to the meta-schemas
jsonschema bundles (jsonschema combines those in); anything else is ``referencing.exceptions.Unresolvable``.
"""

from referencing import Registry
from referencing.jsonschema import SchemaRegistry

#: Pass as ``registry=`` to every validator the server builds. An empty Registry has no ``retrieve``: an
#: unknown URI raises (``Unresolvable``) instead of being fetched.
NO_RETRIEVAL: SchemaRegistry = Registry()
