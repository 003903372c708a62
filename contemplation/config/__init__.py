"""Checking and reloading the whole configuration (its model and loading are ``settings.py``,
a floor below): one check of it (run, doctor, templates, service reload) and its reload without
a restart."""
