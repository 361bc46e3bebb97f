//! A node's attributes, read by name and type. Every operator lists the
//! attributes it understands; any other one is an error, so an attribute the
//! importer would ignore can never change a model's meaning unnoticed.

use crate::proto::{attribute_type as ty, AttributeProto, NodeProto, TensorProto};

pub struct Attrs<'n> {
    attrs: &'n [AttributeProto],
}

impl<'n> Attrs<'n> {
    pub fn new(node: &'n NodeProto, known: &[&str]) -> Result<Attrs<'n>, String> {
        for a in &node.attribute {
            if !a.ref_attr_name.is_empty() {
                return Err(format!("attribute `{}` refers to a function's attribute: not supported", a.name));
            }
            if !known.contains(&a.name.as_str()) {
                return Err(format!("attribute `{}` is not supported", a.name));
            }
        }
        Ok(Attrs { attrs: &node.attribute })
    }

    fn get(&self, name: &str, want: i32) -> Result<Option<&'n AttributeProto>, String> {
        match self.attrs.iter().find(|a| a.name == name) {
            // Type 0 (UNDEFINED): producers before IR version 4 left it out; trust the field read.
            Some(a) if a.r#type == want || a.r#type == 0 => Ok(Some(a)),
            Some(a) => {
                Err(format!("attribute `{name}` is of type {}, expected {}", ty::name(a.r#type), ty::name(want)))
            }
            None => Ok(None),
        }
    }

    pub fn has(&self, name: &str) -> bool {
        self.attrs.iter().any(|a| a.name == name)
    }

    pub fn int(&self, name: &str, default: i64) -> Result<i64, String> {
        Ok(self.get(name, ty::INT)?.map_or(default, |a| a.i))
    }

    pub fn float(&self, name: &str, default: f32) -> Result<f32, String> {
        Ok(self.get(name, ty::FLOAT)?.map_or(default, |a| a.f))
    }

    pub fn ints(&self, name: &str) -> Result<Option<Vec<i64>>, String> {
        Ok(self.get(name, ty::INTS)?.map(|a| a.ints.clone()))
    }

    pub fn floats(&self, name: &str) -> Result<Option<Vec<f32>>, String> {
        Ok(self.get(name, ty::FLOATS)?.map(|a| a.floats.clone()))
    }

    pub fn string(&self, name: &str, default: &str) -> Result<String, String> {
        Ok(self.get(name, ty::STRING)?.map_or(default.to_string(), |a| String::from_utf8_lossy(&a.s).into_owned()))
    }

    pub fn strings(&self, name: &str) -> Result<Option<Vec<String>>, String> {
        Ok(self
            .get(name, ty::STRINGS)?
            .map(|a| a.strings.iter().map(|s| String::from_utf8_lossy(s).into_owned()).collect()))
    }

    pub fn tensor(&self, name: &str) -> Result<Option<&'n TensorProto>, String> {
        Ok(self.get(name, ty::TENSOR)?.and_then(|a| a.t.as_ref()))
    }
}
