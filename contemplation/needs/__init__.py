"""The NEED cycle: the pure rule table (rules), the router that answers a need
through tools (router), and the step that answers a reply's needs (cycle)."""
