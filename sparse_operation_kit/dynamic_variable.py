"""Hash-backed dynamic tables (issue 3). Until they land, no dynamic variable types exist."""

DYNAMIC_TYPES = ()
