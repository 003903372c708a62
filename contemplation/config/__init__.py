"""The whole configuration: one check of it (run, doctor, templates, service reload) and its reload
without a restart."""
