"""Planning: from validated programs to a schedule of segments over arenas."""
