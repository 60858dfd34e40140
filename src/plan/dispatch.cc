// placeholder: being written (issue 4); replaced before landing
