-- Demo: the character's starting equipment.
INSERT INTO equipment (equipment_name) VALUES ('Plasma Rifle') RETURNING id
